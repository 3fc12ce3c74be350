"""Shared pieces of the benchmarks: a process tree's CPU and memory, and result files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


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


def machine() -> dict:
    return {"cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


def save(name: str, record: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.jsonl"
    record = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **record}
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return path


def alternating_medians(steps: dict, repeats: int) -> dict:
    """Median of ``repeats`` calls of each step; the sizes take turns so machine noise hits all alike.

    ``steps`` maps a size (pending entries) to a callable returning microseconds per message.
    """
    import statistics

    runs: dict = {n: [] for n in steps}
    for _ in range(repeats):
        for n, step in steps.items():
            runs[n].append(step())
    return {n: statistics.median(v) for n, v in runs.items()}


def record_node(node: str, throughput: float, at_10: float, at_10000: float, workload: str, **extra) -> dict:
    """Print and save one node benchmark record in the shape bench/nodes.py reads."""
    record = {
        "node": node,
        "throughput_msgs_s": round(throughput),
        "cost_us_at_10": round(at_10, 3),
        "cost_us_at_10000": round(at_10000, 3),
        "ratio": round(at_10000 / at_10, 3),
        "workload": workload,
        **extra,
    }
    print(json.dumps(record))
    save("nodes", record)
    return record
