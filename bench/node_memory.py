"""A node's memory: the resident size of each process of a peer's tree (Python driver, Spark
JVM, PySpark Python workers), idle and at its peak under a burst, for both peers of the pair
on the chained flow (as ``twinflow bench flow-vs-passthrough`` starts them).

    .venv/bin/python bench/node_memory.py --messages 50000 [--peer-arg=--spark-conf=KEY=VALUE]

Resident size (VmRSS) summed over the tree counts pages that forked workers share with their
parent once per process: an upper bound of what the node takes. Figures: docs/performance.md.
"""

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import process_tree, save  # noqa: E402

from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.testing.messages import CHAINED, order_or_payment  # noqa: E402
from twinflow.testing.producers import UplinkPublisher  # noqa: E402


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_by_process(pid: int) -> dict[str, int]:
    """MiB of each process in ``pid``'s tree: "driver", "java", or the Python worker's module."""
    out: dict[str, int] = {}
    for p in process_tree(pid):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = ("driver" if p == pid else "java" if argv[0].endswith(b"java")
                else (argv[2] if len(argv) > 2 else argv[0]).decode(errors="replace") + f" {p}")
        out[name] = round(rss_mib(p))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--peer-arg", action="append", default=[], help="a twinflow run argument for both peers")
    args = ap.parse_args()
    cluster = LocalCluster(tempfile.mkdtemp(prefix="twinflow-memory-"), flow="benchflow", text=CHAINED.read_text(),
                           peer_args=args.peer_arg).start(peers=False)
    store = FlowStore(cluster.redis, cluster.keys, "bench")
    try:
        cluster.start_peers()
        cluster.wait_ready()
        master = cluster.master_epoch()[0]
        pids = {("master" if n == master else "worker"): p.pid for n, p in cluster.peers.items()}
        idle = {role: tree_by_process(pid) for role, pid in pids.items()}
        peak = {role: 0 for role in pids}
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.1):
                for role, pid in pids.items():
                    peak[role] = max(peak[role], sum(tree_by_process(pid).values()))
        watcher = threading.Thread(target=watch)
        watcher.start()
        pub = UplinkPublisher(cluster.redis, store.keys.uplink, order_or_payment)
        pub.publish(args.messages)
        processed = wait_for(lambda: position_order(store.processed_mark() or "0-0") >= position_order(pub.last),
                             600, 0.01)
        wait_for(lambda: False, 5, 0.5)  # five seconds more: what the worker and the timers do after
        done.set()
        watcher.join()
        if not processed:
            raise RuntimeError("the burst was not processed in 600 s")
        record = {"messages": args.messages, "peer_args": args.peer_arg,
                  "idle_mib": {role: sum(v.values()) for role, v in idle.items()},
                  "peak_mib": peak, "idle_by_process": idle}
        save("node_memory", record)
        print(json.dumps(record))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
