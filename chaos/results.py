"""The drills' results table (as on docs/performance/drills.md) from ``twinflow drill ... --json`` lines.

``python -m twinflow.chaos.results FILE.jsonl`` prints, per drill: runs,
passed, lost and duplicated (summed over its runs), and the recovery time's
p50 and max; the Redis failover drills one row per ``wait_replicas``, the clock-skew drill one
per skew. When some drill measured more (the drills between hosts: ``max_gap_s``, the
time-outs' error after a failover), a last column says it, over the drill's runs. A run that
could not reach its check (``error``) counts as run and not passed, and its reason is listed
under the table. A drill that did not apply to the flow (a line with ``not_applicable``) was not
run: it is listed under the table with its reason, once, and counted nowhere.

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
    """The results table of ``rows`` (see the module doc).

    >>> print(table([{"drill": "kill-master", "seed": 1, "lost": 0, "duplicated": 0, "rto_s": 2.0, "passed": True},
    ...              {"drill": "kill-in-handler", "not_applicable": "no guarded handler"}]).splitlines()[-1])
    - kill-in-handler: not applicable: no guarded handler
    """
    skipped = {r["drill"]: r["not_applicable"] for r in rows if "not_applicable" in r}
    rows = [r for r in rows if "not_applicable" not in r]
    by_drill: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        name = r["drill"] + (f" (wait_replicas {r['wait_replicas']})" if "wait_replicas" in r else "") + (
            f" ({r['skew_s']:+g} s)" if r.get("skew_s") is not None else "")
        by_drill[name].append(r)
    more = any(measured(runs) for runs in by_drill.values())
    head = "| drill | runs | passed | lost | duplicated | RTO p50 (s) | RTO max (s) |"
    lines = [head + (" also measured |" if more else ""), "|---|---|---|---|---|---|---|" + ("---|" if more else "")]
    errors = []
    for drill, runs in by_drill.items():
        rtos = [r["rto_s"] for r in runs if r.get("rto_s") is not None]
        lost = sum(r["lost"] or 0 for r in runs)
        dup = sum(r["duplicated"] or 0 for r in runs)
        p50 = f"{statistics.median(rtos):.2f}" if rtos else "-"
        top = f"{max(rtos):.2f}" if rtos else "-"
        passed = sum(bool(r["passed"]) for r in runs)
        lines.append(f"| {drill} | {len(runs)} | {passed} | {lost} | {dup} | {p50} | {top} |"
                     + (f" {measured(runs) or '-'} |" if more else ""))
        errors += [f"- {drill} seed {r['seed']}: {r['error']}" for r in runs if r.get("error")]
    notes = errors + [f"- {drill}: not applicable: {why}" for drill, why in skipped.items()]
    return "\n".join(lines + ([""] + notes if notes else []))


def measured(runs: list[dict]) -> str:
    """What the drill measured beside the counts, over its runs ('' when nothing).

    >>> measured([{"max_gap_s": 0.4}, {"max_gap_s": 0.9}])
    'longest sink gap p50 0.65 s, max 0.90 s'
    >>> measured([{"timeout_error_ms_p50": 20, "timeout_error_ms_min": -10, "timeout_error_ms_max": 300}] * 2)
    'time-out error after failover (ms): p50 of runs 20, min -10, max 300'
    """
    said = []
    gaps = [r["max_gap_s"] for r in runs if r.get("max_gap_s") is not None]
    if gaps:
        said.append(f"longest sink gap p50 {statistics.median(gaps):.2f} s, max {max(gaps):.2f} s")
    errs = [r for r in runs if r.get("timeout_error_ms_p50") is not None]
    if errs:
        said.append(f"time-out error after failover (ms): p50 of runs "
                    f"{statistics.median(r['timeout_error_ms_p50'] for r in errs):.0f}, "
                    f"min {min(r['timeout_error_ms_min'] for r in errs)}, "
                    f"max {max(r['timeout_error_ms_max'] for r in errs)}")
    return "; ".join(said)


def main(argv: list[str]) -> int:
    rows = [json.loads(line) for path in argv for line in open(path) if line.startswith("{")]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
