"""Graceful handover time, by Admin RPC, back and forth between two live peers under load.

Each figure is the Handover RPC's own measure: from the request to the moment
another peer holds the master role with a newer epoch (its rollback done).
Also records the time from the request to the new master's first sink write.

    .venv/bin/python bench/handover.py --runs 5
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import save  # noqa: E402

from twinflow.testing.checker import check_sink, read_sink  # noqa: E402
from twinflow.testing.producers import IngestPublisher  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.client import request_handover  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cluster = LocalCluster(tempfile.mkdtemp(prefix="twinflow-bench-")).start(peers=False)
    try:
        cluster.start_peers()
        cluster.wait_ready()
        pub = IngestPublisher(cluster, count=int(600 * (10 + 4 * args.runs)), rate=600)  # outlasts every run
        pub.start()
        runs = []
        for _ in range(args.runs):
            time.sleep(2.0)  # pacing between handovers under steady load, not a wait for a condition
            master, epoch = cluster.master_epoch()
            asked = time.time()
            r = request_handover(cluster.statuses()[master]["grpc_address"], timeout_s=5)
            assert r["ok"], r
            first = wait_for(lambda: next((e for e in read_sink(cluster.redis, cluster.sink_key)[-2000:]
                                           if e.epoch > epoch), None), 10, 0.02)
            to_write = first.written_ms / 1000 - asked if first else None
            runs.append({"from": master, "to": r["new_master"], "rpc_s": round(r["seconds"], 4),
                         "to_first_write_s": round(to_write, 4) if to_write is not None else None})
            print(runs[-1], flush=True)
        pub.join()
        wait_for(lambda: cluster.sink_count() >= len(pub.ids), 60)
        report = check_sink(read_sink(cluster.redis, cluster.sink_key), pub.ids)
        save("handover", {"runs": runs, "sent": report.sent, "lost": report.lost,
                          "duplicated": report.duplicated})
        print(f"rpc_s: {[r['rpc_s'] for r in runs]}; lost {report.lost}, duplicated {report.duplicated}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
