"""The drills' results table (as on docs/performance.md) from ``twinflow drill ... --json`` lines.

``python -m twinflow.chaos.results FILE.jsonl`` prints, per drill: runs,
passed, lost and duplicated (summed over its runs), and the recovery time's
p50 and max; the Redis failover drills one row per ``wait_replicas``. A run that could not reach its check (``error``) counts as
run and not passed, and its reason is listed under the table.

>>> rows = [{"drill": "kill-master", "seed": s, "lost": 0, "duplicated": 0, "rto_s": r, "passed": True}
...         for s, r in ((1, 2.1), (2, 2.5), (3, 1.9))]
>>> print(table(rows).splitlines()[2])
| kill-master | 3 | 3 | 0 | 0 | 2.10 | 2.50 |
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def table(rows: list[dict]) -> str:
    by_drill: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        name = r["drill"] + (f" (wait_replicas {r['wait_replicas']})" if "wait_replicas" in r else "")
        by_drill[name].append(r)
    lines = ["| drill | runs | passed | lost | duplicated | RTO p50 (s) | RTO max (s) |",
             "|---|---|---|---|---|---|---|"]
    errors = []
    for drill, runs in by_drill.items():
        rtos = [r["rto_s"] for r in runs if r.get("rto_s") is not None]
        lost = sum(r["lost"] or 0 for r in runs)
        dup = sum(r["duplicated"] or 0 for r in runs)
        p50 = f"{statistics.median(rtos):.2f}" if rtos else "-"
        top = f"{max(rtos):.2f}" if rtos else "-"
        lines.append(f"| {drill} | {len(runs)} | {sum(bool(r['passed']) for r in runs)} | {lost} | {dup} | {p50} | {top} |")
        errors += [f"- {drill} seed {r['seed']}: {r['error']}" for r in runs if r.get("error")]
    return "\n".join(lines + ([""] + errors if errors else []))


def main(argv: list[str]) -> int:
    rows = [json.loads(line) for path in argv for line in open(path) if line.startswith("{")]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
