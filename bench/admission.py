"""Burst rate of the pair on the chained flow at different ``uplink.max_batch_size`` caps.

For each cap, a fresh two-peer cluster takes two bursts of N messages
(default 50,000); prints messages per second (publish to the processed mark
passing the last) and the CPU seconds each peer's process tree and Redis used.

    .venv/bin/python bench/admission.py --caps 2000 20000 50000
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import TICKS, cpu_ticks  # noqa: E402
from common import save  # noqa: E402

from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.testing.messages import CHAINED, order_or_payment  # noqa: E402
from twinflow.testing.producers import UplinkPublisher  # noqa: E402
from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.store.flow_keys import FlowKeys  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402

UPLINK = "uplink: {stream: uplink, batch_size: 2000}"


def bursts(cap: int, messages: int, runs: int = 2) -> list[dict]:
    text = CHAINED.read_text().replace(UPLINK, f"uplink: {{stream: uplink, batch_size: 2000, max_batch_size: {cap}}}")
    assert f"max_batch_size: {cap}" in text
    cluster = LocalCluster(tempfile.mkdtemp(prefix="twinflow-bench-"), flow="admission", text=text).start(peers=False)
    store = FlowStore(cluster.redis, FlowKeys("admission"), "bench")
    out = []
    try:
        cluster.start_peers()
        cluster.wait_ready()
        roles = {n: s["role"] for n, s in cluster.statuses().items()}
        pids = {**{n: p.pid for n, p in cluster.peers.items()}, "redis": cluster.services.redis.pid}
        for run in range(runs):
            pub = UplinkPublisher(cluster.redis, store.keys.uplink, order_or_payment)
            pub.seq = run * 10 ** 7
            before = {n: cpu_ticks(p) for n, p in pids.items()}
            t0 = time.monotonic()
            pub.publish(messages)
            done = wait_for(lambda: (m := store.processed_mark()) and position_order(m) >= position_order(pub.last),
                            600, 0.01)
            assert done, "burst not processed in 600 s"
            wall = time.monotonic() - t0
            cpu = {f"{roles.get(n, n)}_cpu_s": round((cpu_ticks(p) - before[n]) / TICKS, 2) for n, p in pids.items()}
            out.append({"cap": cap, "run": run + 1, "msgs_per_s": round(messages / wall), **cpu})
            print(json.dumps(out[-1]), flush=True)
    finally:
        cluster.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--caps", type=int, nargs="+", default=[2000, 20_000, 50_000])
    ap.add_argument("--messages", type=int, default=50_000)
    args = ap.parse_args()
    save("admission", {"messages": args.messages, "runs": [r for cap in args.caps for r in bursts(cap, args.messages)]})


if __name__ == "__main__":
    main()
