"""The demo: two real peers, a SIGKILL of the master mid-stream, and the count.

Starts a local Redis and ZooKeeper, two ``twinflow run`` processes, publishes
messages through the Ingest gRPC service at a steady rate, kills the master
with SIGKILL part-way, and reports sent, lost, duplicated, what each outlink
received and the failover time (kill to the first sink write of the new
master). Everything it started is stopped by PID at the end, also on error
or Ctrl-C.

Two flows: ``chained`` (the default, examples/cluster-chained.yaml: history
-> AND join of an order and its payment -> action, with the claim pair; one
order in ten has no payment and expires, one in ten is sent twice and the
history catches it), and ``claim-pair`` (the action alone, with the claim
pair; what the failover bench measures). Either way every sent message must
leave the flow exactly once, through one outlink.

With ``console`` (``twinflow demo --console 127.0.0.1:8470``) the demo serves the operator
console of its cluster while it runs, and keeps the cluster running after the count until
Ctrl-C: the kill, the failover's phases and the counts can be watched and looked at.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

from twinflow.testing.checker import check_outputs, failover_seconds, read_sink
from twinflow.testing.local_cluster import LocalCluster
from twinflow.testing.messages import CHAINED, order_or_payment
from twinflow.testing.producers import IngestPublisher

FLOWS = ("chained", "claim-pair")


def run_demo(messages: int = 3000, rate: float = 600.0, kill_at: float = 0.4, progress: bool = True,
             keep: bool = False, flow: str = "chained", console: str | None = None) -> dict:
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else (lambda s: None)
    workdir = tempfile.mkdtemp(prefix="twinflow-demo-")
    say(f"work directory {workdir}")
    chained = flow == "chained"
    if chained and not CHAINED.exists():
        raise RuntimeError(f"the demo runs from a source checkout ({CHAINED} is missing)")
    cluster = LocalCluster(workdir, text=CHAINED.read_text() if chained else None).start(peers=False)
    say(f"redis {cluster.services.redis_url}  zookeeper {cluster.services.zk_hosts}")
    served = None
    try:
        if console:
            served = serve_console(cluster, console)
            say(f"console at {served.url}")
        cluster.start_peers()
        say("starting two peers (Spark takes 10-20 s to start)...")
        t0 = time.monotonic()
        cluster.wait_ready()
        old_master, old_epoch = cluster.master_epoch()
        say(f"ready in {time.monotonic() - t0:.1f} s: {old_master} is master (epoch {old_epoch})")

        pub = IngestPublisher(cluster, messages, rate, document=order_or_payment if chained else None)
        pub.start()
        killed_at = None
        last_report = 0.0
        end = time.monotonic() + messages / rate + 90
        while time.monotonic() < end:
            if pub.error:
                raise RuntimeError(f"publishing failed: {pub.error}")
            if killed_at is None and len(pub.ids) >= messages * kill_at:
                cluster.peers[old_master].kill()
                killed_at = time.time()
                say(f"SIGKILL {old_master} (pid {cluster.peers[old_master].pid}) after {len(pub.ids)} messages")
            left = check_outputs(cluster.outputs(), pub.ids).delivered  # sent messages out of the flow
            if time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                roles = ", ".join(f"{n}={s['role']}" for n, s in sorted(cluster.statuses().items())
                                  if cluster.peers[n].alive())
                say(f"  sent {len(pub.ids):>6}  out of the flow {left:>6}  [{roles}]")
            if not pub.is_alive() and killed_at is not None and left >= len(pub.ids):
                break
            time.sleep(0.2)
        outputs = cluster.outputs()
        report = check_outputs(outputs, pub.ids)
        fo = failover_seconds(read_sink(cluster.redis, cluster.sink_key), old_epoch, killed_at) if killed_at else None
        result = {
            "flow": flow,
            "sent": report.sent,
            "delivered": report.delivered,  # sent messages that left the flow, through any outlink
            "lost": report.lost,
            "duplicated": report.duplicated,
            "failover_s": round(fo, 3) if fo is not None else None,
            "killed": old_master,
            "new_master": (cluster.master_epoch() or ("?", 0))[0],
            "outlinks": {name: len(entries) for name, entries in outputs.items() if entries},
        }
        if progress:
            rows = [("sent", result["sent"]), ("out of the flow", result["delivered"]), ("lost", result["lost"]),
                    ("duplicated", result["duplicated"]), ("failover_s", result["failover_s"])]
            rows += [(f"  {name}", n) for name, n in result["outlinks"].items()]
            width = max(len(k) for k, _ in rows)
            print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows), flush=True)
            if report.lost_ids:
                say(f"lost (first 20): {report.lost_ids}")
        if served is not None:
            say(f"the cluster runs on: the console at {served.url}; Ctrl-C stops it")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return result
    finally:
        if served is not None:
            served.stop()
        cluster.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def serve_console(cluster: LocalCluster, listen: str):
    """The operator console of ``cluster`` on ``listen`` (loopback: open, no tokens)."""
    from twinflow.cluster.console.access import ConsoleAccess
    from twinflow.cluster.console.app import ConsoleApp
    from twinflow.cluster.console.server import ConsoleServer
    from twinflow.cluster.console.snapshot import ConsoleView, console_stores
    from twinflow.cluster.handover_request import ask_masters
    from twinflow.grpc_security import NO_SECURITY

    stores = console_stores(cluster.graph, cluster.redis_url, who="demo-console")
    app = ConsoleApp(ConsoleView(cluster.graph, stores), ConsoleAccess(None),
                     handover=lambda: [a.as_dict() for a in ask_masters(stores, NO_SECURITY, 10.0)])
    return ConsoleServer(app, listen)
