"""Sort node: throughput, and per-message cost with 10 and with 10,000 messages held.

Every run drives the node the way replay does: before each message, every
deadline that is due fires at its own time. Messages are built before the
clock starts.

- throughput: 300,000 messages at 10,000/s of virtual time: 75% orders in a
  bake ruleset (bake_time 0.5 s, about 5,000 held; 5% arrive late by up to
  20 keys), 20% trades in a static ruleset, 5% nohit.
- cost at N held (median of 5 runs of 40,000 messages after a warm-up, the
  two sizes taking turns every 2,000 messages), per mode:
  bake: bake_time = N message gaps, keys ascending with 5% late;
  session: sessions of 2N messages (N held on average), then a quiet gap;
  claim: orders bake while the master's escalation of each comes N orders later.
  The saved ``cost_us_*`` and ``ratio`` are bake mode's, QFlow's own
  algorithm; every mode's figures are saved under ``modes``.

    .venv/bin/python bench/node_sort.py
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import sys
from pathlib import Path
from time import perf_counter

from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.sort import build
from twinflow.runtime.params import Doc, Params

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

DT = 0.0001  # seconds between messages: 10,000 messages/s of virtual time
REPS, WINDOW, CHUNK = 5, 40_000, 2_000


def node(yaml_text: str):
    doc = Doc(yaml_text, "bench.yaml")
    return build("sorter", Params(doc, "", doc.value))


def drive(n, events) -> float:
    """Feed (time, message) pairs as replay would; return the seconds it took."""
    start = perf_counter()
    for at, msg in events:
        due = n.next_deadline()
        while due is not None and due <= at:
            n.on_time(due)
            due = n.next_deadline()
        n.on_message(msg, at)
    return perf_counter() - start


def late_keys(count: int, rng: random.Random):
    """Ascending keys; 5% of messages arrive late by up to 20 keys."""
    return [i - rng.randint(1, 20) if rng.random() < 0.05 else i for i in range(count)]


# -- workloads --------------------------------------------------------------------
MIXED = """
rulesets:
  - {name: orders, match: {field: type, equals: order}, key: "{seq}", bake_time: 0.5}
  - {name: trades, match: {field: type, regex: "^trade"}, key: "{book.seq}"}
"""


def mixed(count: int):
    rng = random.Random(1)
    keys = late_keys(count, rng)
    events = []
    for i, key in enumerate(keys):
        r = rng.random()
        if r < 0.75:
            doc = {"id": f"o{i}", "type": "order", "seq": key}
        elif r < 0.95:
            doc = {"id": f"t{i}", "type": "trade", "book": {"seq": key}}
        else:
            doc = {"id": f"q{i}", "type": "quote", "seq": key}
        events.append((i * DT, Msg(doc["id"], doc)))
    return events


def bake(held: int):
    keys = late_keys(held * 3 + WINDOW, random.Random(2))
    events = [(i * DT, Msg(f"m{i}", {"seq": k})) for i, k in enumerate(keys)]
    return node(f"rulesets:\n  - {{name: a, key: '{{seq}}', bake_time: {held * DT}}}\n"), events[:held * 3], events[held * 3:]


def session(held: int):
    rng = random.Random(3)
    size = 2 * held
    warm = size * max(1, 10_000 // size)  # whole sessions, so the window starts like any session
    keys = late_keys(warm + WINDOW, rng)
    # A quiet gap of 2 ms after every session: the 1 ms session timeout flushes it.
    events = [((i + 20 * (i // size)) * DT, Msg(f"m{i}", {"seq": k})) for i, k in enumerate(keys)]
    return node("rulesets:\n  - {name: a, key: '{seq}', session_timeout: 0.001}\n"), events[:warm], events[warm:]


CLAIM = """
id_ttl: 3600
rulesets:
  - {name: esc, type: claim, match: {field: type, equals: esc}, key: "{seq}", id: "{ref}"}
  - {name: orders, match: {field: type, equals: order}, key: "{seq}", id: "{id}", bake_time: 5}
"""


def claim(held: int):
    pairs = (held * 3 + WINDOW) // 2
    events, t = [], 0.0
    for i in range(pairs):
        events.append((t, Msg(f"o{i}", {"id": f"o{i}", "type": "order", "seq": i})))
        t += DT
        if i >= held:  # the master escalates order i - held now
            j = i - held
            events.append((t, Msg(f"e{j}", {"id": f"e{j}", "type": "esc", "ref": f"o{j}", "seq": j})))
            t += DT
    return node(CLAIM), events[:held * 3], events[held * 3:]


def costs(make) -> dict:
    """Median microseconds per message at 10 and at 10,000 held, over REPS fresh pairs of runs.

    The two sizes run side by side, taking turns every CHUNK messages, so that
    the machine's speed drifting (other processes, a shared host) hits both alike.
    """
    runs: dict[int, list[float]] = {10: [], 10_000: []}
    held_at_end: dict[int, int] = {}
    for _ in range(REPS):
        nodes, windows = {}, {}
        for held in runs:
            nodes[held], warm, windows[held] = make(held)
            drive(nodes[held], warm)
        # Timing starts with the same heap for both: the windows' messages and
        # what the nodes hold (the warm-up's other messages would make every
        # full garbage collection dearer for one size than for the other).
        del warm
        gc.collect()
        length = min(len(w) for w in windows.values())
        spent = dict.fromkeys(runs, 0.0)
        for start in range(0, length, CHUNK):
            for held in runs:
                spent[held] += drive(nodes[held], windows[held][start:start + CHUNK])
        for held in runs:
            runs[held].append(spent[held] / length * 1e6)
            held_at_end[held] = nodes[held].pending()
    at10, at10k = statistics.median(runs[10]), statistics.median(runs[10_000])
    return {"cost_us_at_10": round(at10, 3), "cost_us_at_10000": round(at10k, 3),
            "ratio": round(at10k / at10, 3), "held_at_end": [held_at_end[10], held_at_end[10_000]]}


def main() -> None:
    events = mixed(300_000)
    runs = []
    for _ in range(3):
        runs.append(len(events) / drive(node(MIXED), events))
    throughput = statistics.median(runs)

    modes = {name: costs(make) for name, make in (("bake", bake), ("session", session), ("claim", claim))}
    main_mode = modes["bake"]
    record = {
        "node": "sort",
        "throughput_msgs_s": round(throughput),
        "cost_us_at_10": main_mode["cost_us_at_10"],
        "cost_us_at_10000": main_mode["cost_us_at_10000"],
        "ratio": main_mode["ratio"],
        "workload": "300k msgs: 75% bake ruleset (0.5 s, ~5k held, 5% late keys), 20% static ruleset, "
                    "5% nohit; costs: bake mode, keys ascending with 5% late (other modes under 'modes')",
        "modes": modes,
    }
    print(json.dumps(record))
    save("nodes", record)


if __name__ == "__main__":
    main()
