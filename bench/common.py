"""Shared pieces of the benchmarks: result files, medians; a process tree's CPU and memory
(from ``twinflow.testing.proc_stats``, re-exported here)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

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
