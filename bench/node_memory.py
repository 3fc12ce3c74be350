"""A node's memory: the resident size of each process of a peer's tree (Python driver, Spark
JVM, PySpark Python workers), idle and at its peak under a burst, for both peers of the pair
on the chained flow (as ``twinflow bench flow-vs-passthrough`` starts them).

    .venv/bin/python bench/node_memory.py --messages 50000 [--peer-arg=--spark-conf=KEY=VALUE]

Resident size (VmRSS) summed over the tree counts a page that several processes map (a library,
pages a forked worker shares with its parent) once per process: an upper bound of what the node
takes. Proportional size (Pss, /proc/PID/smaps_rollup) charges such a page in shares, so its sum
over the tree is what the node adds to the machine (the other peer's processes map the same
libraries: both trees' PSS together is what the pair takes). Each figure is given per process
too: idle, and each process's own peak over the burst. Figures: docs/performance.md.
"""

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import process_tree, save  # noqa: E402

from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.testing.messages import CHAINED, order_or_payment  # noqa: E402
from twinflow.testing.producers import UplinkPublisher  # noqa: E402


def rss_pss_mib(pid: int) -> tuple[float, float]:
    """Resident and proportional size of one process (0, 0 once it is gone)."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss / 1024, pss / 1024


def tree_by_process(pid: int) -> dict[str, tuple[float, float]]:
    """(RSS, PSS) MiB of each process in ``pid``'s tree: "driver", "java", or the Python worker's module."""
    out: dict[str, tuple[float, float]] = {}
    for p in process_tree(pid):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = ("driver" if p == pid else "java" if argv[0].endswith(b"java")
                else (argv[2] if len(argv) > 2 else argv[0]).decode(errors="replace") + f" {p}")
        figures = rss_pss_mib(p)
        if figures[0]:  # not gone (nor a kernel thread)
            out[name] = figures
    return out


def settled(pids: dict[str, int], quiet_s: float = 2.0, deadline_s: float = 20.0) -> None:
    """Wait until no process joins or leaves the trees for ``quiet_s`` (a query's start runs short-lived
    Python workers, planning its reads, for a few seconds after the peer says it is ready)."""
    seen, since, end = None, time.monotonic(), time.monotonic() + deadline_s
    while time.monotonic() < end:
        now = {role: sorted(process_tree(pid)) for role, pid in pids.items()}
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


def column(tree: dict[str, tuple[float, float]], i: int) -> dict[str, int]:
    """One figure of each process (0: RSS, 1: PSS), rounded to MiB."""
    return {name: round(v[i]) for name, v in tree.items()}


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
        settled(pids)
        idle = {role: tree_by_process(pid) for role, pid in pids.items()}
        peak = {role: sum(v[0] for v in idle[role].values()) for role in pids}
        peak_pss = {role: sum(v[1] for v in idle[role].values()) for role in pids}
        peak_by: dict = {role: dict(idle[role]) for role in pids}  # each process's own peak (RSS, PSS)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.1):
                for role, pid in pids.items():
                    tree = tree_by_process(pid)
                    peak[role] = max(peak[role], sum(v[0] for v in tree.values()))
                    peak_pss[role] = max(peak_pss[role], sum(v[1] for v in tree.values()))
                    for name, (rss, pss) in tree.items():
                        old = peak_by[role].get(name, (0.0, 0.0))
                        peak_by[role][name] = (max(old[0], rss), max(old[1], pss))
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
                  "idle_mib": {role: sum(column(v, 0).values()) for role, v in idle.items()},
                  "peak_mib": {role: round(v) for role, v in peak.items()},
                  "idle_by_process": {role: column(v, 0) for role, v in idle.items()},
                  "idle_pss_mib": {role: sum(column(v, 1).values()) for role, v in idle.items()},
                  "peak_pss_mib": {role: round(v) for role, v in peak_pss.items()},
                  "idle_pss_by_process": {role: column(v, 1) for role, v in idle.items()},
                  "peak_by_process": {role: column(v, 0) for role, v in peak_by.items()},
                  "peak_pss_by_process": {role: column(v, 1) for role, v in peak_by.items()}}
        save("node_memory", record)
        print(json.dumps(record))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
