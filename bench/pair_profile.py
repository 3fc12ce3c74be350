"""Where the pair's CPU goes in a burst: every process of each peer's tree, per burst.

Starts the two-peer cluster on the chained flow (as ``twinflow bench
flow-vs-passthrough`` does), then sends ``--bursts`` bursts of ``--messages``
and prints, per burst, the wall time until the master's processed mark
passes the last message and the CPU seconds (user + system, from /proc) of
each peer's Python driver, JVM and reader workers. With ``--flame DIR`` the
last burst is also sampled by py-spy (``pip install py-spy``; root, or
ptrace allowed) on both drivers, every thread, waits included (``--idle``:
the pair waits more than it works, so the waits are what to see), without
stopping the driver to read it (``--nonblocking``: a peer's 20 threads at
100 Hz would otherwise fall seconds behind on 2 cores): a flame graph per
role, ``DIR/flame-master.svg`` and ``DIR/flame-worker.svg``, and the raw
stacks beside them. Figures: docs/performance/throughput.md.

    .venv/bin/python bench/pair_profile.py --messages 50000 --bursts 3 --flame docs/images
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import TICKS, process_ticks, process_tree  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.testing.messages import CHAINED, order_or_payment  # noqa: E402
from twinflow.testing.producers import UplinkPublisher  # noqa: E402
from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402

def tree_cpu(pid: int) -> dict[str, int]:
    """CPU ticks of each process in ``pid``'s tree, named by what it is (driver, java, worker pid)."""
    out: dict[str, int] = {}
    for p in process_tree(pid):
        try:
            argv0 = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        name = "driver" if p == pid else "java" if argv0.endswith(b"java") else f"python {p}"
        out[name] = out.get(name, 0) + process_ticks(p, reaped=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--flame", metavar="DIR", help="sample both drivers in the last burst: flame graphs here")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")),
                    help="path of py-spy (default: on PATH, or beside this Python)")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default 100)")
    ap.add_argument("--peer-arg", action="append", default=[], help="a twinflow run argument for both peers")
    args = ap.parse_args()
    cluster = LocalCluster(tempfile.mkdtemp(prefix="twinflow-pair-profile-"), flow="benchflow",
                           text=CHAINED.read_text(), peer_args=args.peer_arg).start(peers=False)
    store = FlowStore(cluster.redis, cluster.keys, "bench")
    try:
        cluster.start_peers()
        cluster.wait_ready()
        master = cluster.master_epoch()[0]
        pids = {n: p.pid for n, p in cluster.peers.items()}
        pub = UplinkPublisher(cluster.redis, store.keys.uplink, order_or_payment)
        for burst in range(args.bursts):
            spies = []
            if args.flame and burst == args.bursts - 1:
                Path(args.flame).mkdir(parents=True, exist_ok=True)
                for n, pid in pids.items():
                    role = "master" if n == master else "worker"
                    for fmt, name in (("flamegraph", f"flame-{role}.svg"), ("raw", f"flame-{role}.txt")):
                        spies.append(subprocess.Popen(
                            [args.py_spy, "record", "--idle", "--threads", "--nonblocking", "-r", str(args.rate),
                             "-f", fmt, "-p", str(pid), "-o", f"{args.flame}/{name}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                wait_for(lambda: all(Path(f"/proc/{s.pid}").exists() for s in spies), 10, 0.1)
            before = {n: tree_cpu(pid) for n, pid in pids.items()}
            t0 = time.monotonic()
            pub.publish(args.messages)
            published = time.monotonic() - t0
            if not wait_for(lambda: position_order(store.processed_mark() or "0-0") >= position_order(pub.last),
                            600, 0.005):
                raise RuntimeError("the burst was not processed in 600 s")
            wall = time.monotonic() - t0
            after = {n: tree_cpu(pid) for n, pid in pids.items()}
            for s in spies:
                s.send_signal(2)  # py-spy writes its file on SIGINT
                s.wait(60)
            cpu = {n: {k: round((v - before[n].get(k, 0)) / TICKS, 2) for k, v in after[n].items()
                       if v - before[n].get(k, 0) > 1} for n in pids}
            print(json.dumps({"burst": burst, "master": master, "publish_s": round(published, 2),
                              "wall_s": round(wall, 2), "msgs_per_s": round(args.messages / wall), "cpu_s": cpu}),
                  flush=True)
    finally:
        cluster.stop()
        cluster.remove()


if __name__ == "__main__":
    main()
