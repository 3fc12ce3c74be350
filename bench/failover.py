"""Failover time: SIGKILL of the master mid-stream to the first sink write of the new master.

Runs the demo N times (2 s ZooKeeper session) and records each run's figure,
with lost and duplicated counts, in bench/results/failover.jsonl.

    .venv/bin/python bench/failover.py --runs 5
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import save  # noqa: E402

from twinflow_dev.demo import run_demo  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=600.0)
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        r = run_demo(messages=args.messages, rate=args.rate, progress=False, flow="claim-pair")
        runs.append(r)
        print(f"run {i + 1}: failover {r['failover_s']} s, sent {r['sent']}, lost {r['lost']}, "
              f"duplicated {r['duplicated']}", flush=True)
    figures = [r["failover_s"] for r in runs]
    save("failover", {"runs": runs, "failover_s": figures, "max_s": max(figures), "session_timeout_s": 2.0})
    print(f"failover_s per run: {figures}; max {max(figures)}")


if __name__ == "__main__":
    main()
