"""CPU time and resident memory of a process tree, read from ``/proc`` (Linux): what the
benchmarks and ``twinflow bench`` charge to a peer, a bare reader or a server.

Under failure: a process that ends while it is being read counts as gone (0 ticks, no memory),
never as an error: a tree is read while its processes come and go.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process descending from it now (the peer's Python, JVM, workers)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            fields = _stat(int(d))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(d))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def process_group(pgid: int) -> list[int]:
    """The PIDs of process group ``pgid`` now (a peer started in its own session: it and its JVM)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            fields = _stat(int(d))
            if fields is not None and int(fields[2]) == pgid:
                pids.append(int(d))
    return pids


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state is [0]), or None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_ticks(pid: int, reaped: bool = False) -> int:
    """utime + stime of one process; with ``reaped``, also the CPU of the children it has
    waited for (short-lived workers that are gone)."""
    fields = _stat(pid)
    return 0 if fields is None else sum(int(x) for x in fields[11:15 if reaped else 13])


def cpu_ticks(pid: int, reaped: bool = False) -> int:
    """CPU ticks of a process and its descendants (see ``process_ticks``)."""
    return sum(process_ticks(p, reaped) for p in process_tree(pid))


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024
