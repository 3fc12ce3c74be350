"""Where py-spy's samples went: the functions with the most samples in them (inclusive) and
at the top of the stack (self), from ``py-spy record -f raw`` files.

    .venv/bin/python bench/pyspy_top.py DIR/shards1-*.txt --top 30 [--busy]

``--busy`` leaves out samples whose leaf is a wait (a socket read, a select, a lock, a sleep):
with ``--idle`` py-spy also samples idle workers, which tells where the wall time goes, while
``--busy`` tells where the CPU goes. Percentages are of the samples kept.

Under failure: a line that is not ``stack count`` is skipped.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

WAITS = ("select", "poll", "recv", "recv_into", "readinto", "accept", "wait", "sleep", "acquire", "_wait_for_tstate_lock",
         "read", "epoll")
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def frame_name(frame: str) -> str:
    """``fn (path/file.py:123)`` as ``fn (file.py)``: one name per function, whatever line."""
    m = re.match(r"^(.*?) \((?:.*/)?([^/:]+)(?::\d+)?\)$", frame)
    return f"{m.group(1)} ({m.group(2)})" if m else frame


def top(paths: list[str], busy: bool) -> tuple[int, Counter, Counter]:
    total, inclusive, own = 0, Counter(), Counter()
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                m = _LINE.match(line.rstrip("\n"))
                if not m:
                    continue
                frames = [frame_name(x) for x in m.group("stack").split(";")[1:]]  # [0]: the process
                n = int(m.group("count"))
                if not frames or (busy and frames[-1].split(" ")[0] in WAITS):
                    continue
                total += n
                for name in set(frames):
                    inclusive[name] += n
                own[frames[-1]] += n
    return total, inclusive, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--busy", action="store_true")
    args = ap.parse_args()
    total, inclusive, own = top(args.paths, args.busy)
    print(f"{total} samples")
    for title, counts in (("inclusive", inclusive), ("self", own)):
        print(f"-- {title}")
        for name, n in counts.most_common(args.top):
            print(f"{n / max(total, 1):7.1%}  {name}")


if __name__ == "__main__":
    main()
