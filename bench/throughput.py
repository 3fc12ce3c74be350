"""Messages per second through the pair, and each peer's memory.

Starts two peers, then publishes N messages into the uplink as fast as one
Redis pipeline goes, and measures until the master has delivered all of them
and the worker has read all of them (baked and seen claimed, or skipped as
processed). Memory is the resident size of each
peer's whole process tree (Python driver, Spark JVM, PySpark workers).

    .venv/bin/python bench/throughput.py --messages 50000
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import save, tree_rss_mib  # noqa: E402

from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402
from twinflow.runtime.store.flow_keys import FlowKeys  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    args = ap.parse_args()
    cluster = LocalCluster(tempfile.mkdtemp(prefix="twinflow-bench-")).start(peers=False)
    try:
        cluster.start_peers()
        cluster.wait_ready()
        idle_mem = {n: round(tree_rss_mib(p.pid)) for n, p in cluster.peers.items()}
        store = FlowStore(cluster.redis, FlowKeys(cluster.flow), "bench")
        master, _ = cluster.master_epoch()
        worker = next(n for n in cluster.peers if n != master)
        t0 = time.monotonic()
        for i in range(0, args.messages, 5000):
            store.publish(json.dumps({"id": f"t{j}", "seq": j}).encode()
                          for j in range(i, min(i + 5000, args.messages)))
        published = time.monotonic() - t0
        peak = {n: 0.0 for n in cluster.peers}

        def done():
            for n, p in cluster.peers.items():
                peak[n] = max(peak[n], tree_rss_mib(p.pid))
            st = cluster.statuses()
            # The worker has read (baked and seen claimed, or skipped as processed) every entry.
            return cluster.sink_count() >= args.messages and st.get(worker, {}).get("uplink_lag") == "0"

        assert wait_for(done, 600, 0.1), "the pair did not finish"
        elapsed = time.monotonic() - t0
        delivered_at = elapsed
        rate = args.messages / delivered_at
        record = {"messages": args.messages, "publish_s": round(published, 2), "elapsed_s": round(elapsed, 2),
                  "msgs_per_s": round(rate), "idle_rss_mib": idle_mem,
                  "peak_rss_mib": {n: round(v) for n, v in peak.items()}, "master": master}
        save("throughput", record)
        print(json.dumps(record))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
