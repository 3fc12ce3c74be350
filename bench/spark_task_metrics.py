"""Spark's own task metrics of the tasks that ran in given spans, from the applications' event logs.

    .venv/bin/python bench/spark_task_metrics.py EVENT_LOG_DIR --since MS --until MS --messages N

Sums, over every ``SparkListenerTaskEnd`` whose task launched in a span, each task metric
(run time, CPU time, deserialisation, result serialisation, GC; times in µs per message) and
each SQL metric the task updated (the Python nodes': time spent executing, bytes to and from
the Python workers, rows), and counts tasks. ``bench/shards.py --profile`` calls
:func:`task_metrics` per configuration with its bursts' spans.

Under failure: an event log line that is not JSON (a log being written) is skipped; a file
that cannot be read is skipped; a span with no task gives ``{"tasks": 0}``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

# Task Metrics fields and their unit: ms or ns.
TIMES = {"Executor Deserialize Time": "ms", "Executor Deserialize CPU Time": "ns", "Executor Run Time": "ms",
         "Executor CPU Time": "ns", "JVM GC Time": "ms", "Result Serialization Time": "ms"}


def _events(log_dir: Path, app_prefix: str):
    # One file per application, or (rolling logs, Spark 4's default) one directory per
    # application holding its events_<n>_... files.
    for app_path in sorted(log_dir.iterdir()):
        files = sorted((p for p in app_path.iterdir() if p.name.startswith("events_") and "." not in p.name),
                       key=lambda p: int(p.name.split("_")[1])) if app_path.is_dir() else [app_path]
        lines = []
        for path in files:
            try:
                lines += path.read_text(errors="replace").splitlines()
            except OSError:
                continue
        app = ""
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("Event") == "SparkListenerApplicationStart":
                app = event.get("App Name", "")
            if app.startswith(app_prefix):
                yield event


def task_metrics(log_dir: str | Path, spans: list[tuple[float, float]], messages: int, app_prefix: str = "") -> dict:
    """Per-message sums of the task metrics of tasks launched within ``spans`` (epoch ms), over
    the applications whose name starts with ``app_prefix``."""
    sums: Counter = Counter()
    sql: Counter = Counter()
    tasks = 0
    for event in _events(Path(log_dir), app_prefix):
        if event.get("Event") != "SparkListenerTaskEnd":
            continue
        info, metrics = event.get("Task Info", {}), event.get("Task Metrics") or {}
        launched = info.get("Launch Time", 0)
        if not any(a <= launched <= b for a, b in spans):
            continue
        tasks += 1
        for name, unit in TIMES.items():
            value = metrics.get(name) or 0
            sums[name] += value * (1000 if unit == "ms" else 1e-3)  # in µs
        for acc in info.get("Accumulables", []):
            if acc.get("Metadata") == "sql" or "Update" in acc:
                try:
                    sql[acc.get("Name", "?")] += float(acc.get("Update") or 0)
                except (TypeError, ValueError):
                    pass
    if not tasks:
        return {"tasks": 0}
    return {"tasks": tasks, "messages_per_task": round(messages / tasks, 1),
            "us_per_msg": {k: round(v / messages, 1) for k, v in sums.items()},
            "sql_per_msg": {k: round(v / messages, 3) for k, v in sorted(sql.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log_dir")
    ap.add_argument("--since", type=float, required=True)
    ap.add_argument("--until", type=float, required=True)
    ap.add_argument("--messages", type=int, required=True)
    ap.add_argument("--app-prefix", default="")
    args = ap.parse_args()
    print(json.dumps(task_metrics(args.log_dir, [(args.since, args.until)], args.messages, args.app_prefix), indent=1))


if __name__ == "__main__":
    main()
