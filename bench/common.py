"""Shared pieces of the benchmarks: result files, medians, a scratch Redis; a process tree's CPU
and memory (from ``twinflow.testing.proc_stats``, re-exported here)."""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from twinflow.testing.proc_stats import TICKS, cpu_ticks, process_ticks, process_tree, tree_rss_mib  # noqa: F401

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    return {"cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


def save(name: str, record: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.jsonl"
    record = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), **record}
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return path


@contextmanager
def scratch_redis(prefix: str) -> Iterator[tuple[int, Path]]:
    """A redis-server of its own on 127.0.0.1 with nothing persisted, for the block: its port
    and a directory for files; stopped by PID after the block, also when it raises."""
    from twinflow.testing.servers import kill_pid, start_answering, start_redis

    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        server = start_answering(lambda p: start_redis(p, "--appendonly", "no", "--save", ""), Path(d), 30)
        try:
            yield server.port, Path(d)
        finally:
            kill_pid(server.pid)


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
