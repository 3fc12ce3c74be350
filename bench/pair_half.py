"""The pair half of ``twinflow bench flow-vs-passthrough`` alone, ``--runs`` times, on fresh
local services: to compare settings (``--peer-arg``, passed to both peers' ``twinflow run``)
or code (run it with another checkout's Python) in the same hour. One JSON line per run.

    .venv/bin/python bench/pair_half.py --runs 3 --peer-arg=--worker-read-behind-ms=500
"""

import argparse
import json
import tempfile

from twinflow_dev.flow_bench import Load, flow
from twinflow.testing.services import LocalServices


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--peer-arg", action="append", default=[], help="a twinflow run argument for both peers")
    args = ap.parse_args()
    for _ in range(args.runs):
        services = LocalServices.start(base_dir=tempfile.mkdtemp(prefix="twinflow-bench-"), deadline_s=60)
        try:
            load = Load(args.messages, args.rate, args.seconds)
            out = flow(services, load, peer_args=tuple(args.peer_arg)) if args.peer_arg else flow(services, load)
            print(json.dumps({"peer_args": args.peer_arg, **out}), flush=True)
        finally:
            services.stop()


if __name__ == "__main__":
    main()
