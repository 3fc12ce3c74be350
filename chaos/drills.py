"""Chaos drills: a fault on one link or process of a live two-peer cluster while a producer
publishes, then a check of the promises (``twinflow drill NAME``).

Each drill runs on a fresh :class:`~twinflow.testing.local_cluster.LocalCluster`
(every link through the fault proxy) with the chained flow by default
(history -> AND join -> action, with the claim pair), so faults also hit
pending joins and their time-outs. A producer publishes ``messages`` orders
and payments (twinflow/testing/messages.py) at ``rate`` per second, or, for
a flow file whose fields they lack, messages made from its own fields or from
example messages (twinflow/testing/flow_messages.py); the drill injects its
fault at a point given as a share of the messages sent. Then the one checker
(:mod:`twinflow.testing.checker`) reads every outlink and counts:

- ``lost``: sent messages that never left the flow;
- ``duplicated``: leavings beyond the first per message;
- ``out_of_order``: resequence outputs out of sequence within a group;
- ``stale_writes``: outputs written by a master after a newer epoch's first
  write, or at an epoch another peer wrote at (one writer per epoch);
- ``rto_s``: for each fault, from the fault itself (the time the drill
  injected it) to the first write after it, or to the first write of a newer
  epoch when one wrote after it (the largest, when a drill faults twice; none
  when nothing was written after a fault).

The Redis failover drills (``redis-failover`` on Sentinel,
``redis-cluster-failover`` on a Redis Cluster) run with ``cluster.wait_replicas``
(default 1: ``wait_replicas`` in :func:`run_drill`, ``--wait-replicas`` on the
command line) and count, of the lost messages, those whose uplink entry is gone
too (``lost_in_uplink``: the producer's write itself did not survive).

A drill passes with nothing lost, duplicated, out of order or written
stale, and (for the drills that kill the master) ``rto_s`` under 3 s. The
``seed`` fixes every random choice; the command that reruns a drill is in
its result.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable

from ..runtime.waiting import wait_for
from ..cluster.zk_paths import ZkPaths
from ..runtime.flowgraph import parse_graph
from ..testing.flow_messages import CHAINED_MESSAGES, messages_for
from ..testing.messages import CHAINED
from ..testing.producers import DrillProducer, PacedProducer
from ..testing import checker
from ..testing.local_cluster import LocalCluster
from . import drill_fit, guarded_drills
from .report import timeline

RTO_TARGET_S = 3.0


class FaultRecord:
    """When each fault began and what it was, and how far the producer got: what a drill on a
    local cluster (:class:`Drill`) and a drill between lab hosts (``host_drills.HostDrill``)
    both keep. Needs ``sent``, ``total``, ``faults``, ``windows`` and ``say``."""

    sent: Callable[[], int]
    total: int
    faults: list[float]
    windows: list[list]
    say: Callable[[str], None]

    def wait_sent(self, share: float, timeout_s: float = 300) -> None:
        want = int(self.total * share)
        if not wait_for(lambda: self.sent() >= want, timeout_s, 0.05):
            raise RuntimeError(f"the producer did not reach {want} messages")

    def fault(self, what: str, lasts: bool = False) -> None:
        """A fault begins now (its recovery time counts); ``lasts``: until ``healed()``, else an instant."""
        now = time.time()
        self.faults.append(now)
        self.windows.append([now, None if lasts else now, what])
        self.say(f"  fault: {what} (after {self.sent()} messages)")

    def window(self, what: str) -> None:
        """A condition from now to the end of the drill (or ``healed()``) that is no fault of its own."""
        self.windows.append([time.time(), None, what])
        self.say(f"  {what}")

    def healed(self) -> None:
        """The last fault still on ends now."""
        for w in reversed(self.windows):
            if w[1] is None:
                w[1] = time.time()
                return


@dataclass
class Drill(FaultRecord):
    """What a drill function sees: the cluster, the roles at the start, the seeded random source."""

    cluster: LocalCluster
    master: str
    worker: str
    rng: random.Random
    sent: Callable[[], int]
    total: int
    faults: list[float] = field(default_factory=list)  # when each fault began (epoch s)
    windows: list[list] = field(default_factory=list)  # [start, end or None (still on), what], for the timeline
    say: Callable[[str], None] = lambda text: None
    producing: threading.Event = field(default_factory=threading.Event)  # cleared: the producer waits

    def __post_init__(self) -> None:
        self.producing.set()

    def resume(self, share: float = 0.1) -> None:
        """Let a held producer go on, and wait until ``share`` more of the messages went out, so
        the next fault finds the cluster under load again (the recovery time needs writes before it)."""
        want = self.sent() + int(self.total * share)
        self.producing.set()
        if not wait_for(lambda: self.sent() >= want, 300, 0.05):
            raise RuntimeError(f"the producer did not reach {want} messages")

    def kill(self, master: str, heir: str) -> None:
        """The fault most drills end with: SIGKILL ``master``; wait until ``heir`` is master.

        Refuses when ``master`` is no longer master: the drill would not test what it says
        (with the proxy's old latency, the redis-latency drill's master had lost its role)."""
        now = self.cluster.master()
        if now != master:
            raise RuntimeError(f"{master} is not master before the fault (master: {now}):\n{self.cluster.logs()}")
        self.fault(f"SIGKILL master {master}")
        self.cluster.peers[master].kill()
        self.cluster.wait_role(heir, "master")


# -- the drills ------------------------------------------------------------------------------------
def kill_master(d: Drill) -> None:
    d.wait_sent(0.4)
    d.kill(d.master, d.worker)


def kill_in_handler(d: Drill) -> None:
    """The guarded flow (guarded_drills.py): SIGKILL the master while a handler call of its is
    under way (a call begun, its order not booked), then let the worker take over."""
    d.wait_sent(0.4)
    ledger = Path(os.environ["TWINFLOW_LEDGER"])
    pid = d.cluster.peers[d.master].pid

    def inside() -> bool:
        lines = (ledger / "calls.jsonl").read_text().splitlines() if (ledger / "calls.jsonl").exists() else []
        last = json.loads(lines[-1]) if lines else None
        return last is not None and last["pid"] == pid and not (
            ledger / "booked" / guarded_drills.booking_name(last["uuid"])).exists()

    if not wait_for(inside, 60, 0.001):
        raise RuntimeError(f"the master was never seen inside a handler call:\n{d.cluster.logs()}")
    d.kill(d.master, d.worker)


def resubmit_in_failover(d: Drill) -> None:
    """The guarded flow with every 7th message refused by the ledger (audited FAILED): once some
    are, the ledger takes every order again, the master is killed, and while the worker takes
    over an operator resubmits every FAILED entry; after the stream, once more whatever failed since."""
    cl = d.cluster
    ledger = Path(os.environ["TWINFLOW_LEDGER"])
    d.wait_sent(0.4)
    if not wait_for(lambda: cl.redis.xlen(cl.keys.audit) >= 3, 60, 0.05):
        raise RuntimeError(f"no message was audited FAILED:\n{cl.logs()}")
    d.say(f"  the ledger takes every order again ({guarded_drills.accept_all(ledger)} refused so far)")
    now = cl.master()
    if now != d.master:
        raise RuntimeError(f"{d.master} is not master before the fault (master: {now})")
    d.fault(f"SIGKILL master {d.master}; every FAILED entry resubmitted while {d.worker} takes over")
    cl.peers[d.master].kill()
    d.say(f"  {_resubmit_all(cl)}")
    cl.wait_role(d.worker, "master")


def _resubmit_all(cluster: LocalCluster) -> str:
    """``twinflow failures resubmit --all`` over Redis, as an operator runs it."""
    r = subprocess.run([sys.executable, "-m", "twinflow.cli", "failures", "resubmit", str(cluster.flow_path),
                        "--all", "--redis", cluster.redis_url, "--by", "drill"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"twinflow failures resubmit failed ({r.returncode}): {r.stderr[-2000:]}")
    return (r.stdout.strip().splitlines() or ["nothing to resubmit"])[-1]


def pause_master(d: Drill) -> None:
    """SIGSTOP past the session: the worker takes over; SIGCONT: the old master is fenced, steps down."""
    d.wait_sent(0.4)
    d.fault(f"SIGSTOP master {d.master}", lasts=True)
    d.cluster.peers[d.master].pause()
    d.cluster.wait_role(d.worker, "master")
    d.cluster.peers[d.master].cont()
    d.healed()
    d.say(f"  SIGCONT {d.master}")
    d.cluster.wait_role(d.master, "worker")


def escalation_cut(d: Drill) -> None:
    """The master's escalations to the worker cut for 3 s, then the master killed."""
    d.wait_sent(0.3)
    link = d.cluster.proxies[f"grpc-{d.worker}"]
    d.window(f"escalations into {d.worker} cut")
    link.disable()
    time.sleep(3.0)  # the fault window: how long the link stays cut
    link.enable()
    d.healed()
    d.wait_sent(0.5)
    d.kill(d.master, d.worker)


def escalation_latency(d: Drill) -> None:
    d.cluster.proxies[f"grpc-{d.worker}"].add_toxic(type="latency", attributes={"latency": 500})
    d.window(f"500 ms latency on escalations into {d.worker}")
    d.wait_sent(0.5)
    d.kill(d.master, d.worker)


def redis_latency(d: Drill) -> None:
    for stream in ("upstream", "downstream"):
        d.cluster.proxies[f"redis-{d.master}"].add_toxic(type="latency", stream=stream,
                                                         attributes={"latency": 100})
    d.window(f"200 ms round-trip latency between {d.master} and Redis")
    d.wait_sent(0.5)
    d.kill(d.master, d.worker)


def worker_crash(d: Drill) -> None:
    d.wait_sent(0.3)
    d.window(f"SIGKILL worker {d.worker}, then restart it")
    d.producing.clear()  # the restart takes longer than the rest of the stream: keep some for the kill
    d.cluster.peers[d.worker].kill()
    d.cluster.restart(d.worker)
    d.healed()
    d.resume()
    d.kill(d.master, d.worker)


def double_failover(d: Drill) -> None:
    a, b = d.master, d.worker
    d.wait_sent(0.25)
    d.kill(a, b)
    d.producing.clear()  # as in worker_crash: the second kill must come while messages still flow
    d.cluster.restart(a)
    d.say(f"  restarted {a}")
    d.resume()
    d.kill(b, a)


def zk_partition_master(d: Drill) -> None:
    """The master cut from ZooKeeper only: it must stop writing before the worker starts."""
    d.wait_sent(0.4)
    d.fault(f"cut {d.master} from ZooKeeper", lasts=True)
    d.cluster.proxies[f"zk-{d.master}"].disable()
    d.cluster.wait_role(d.worker, "master")
    d.cluster.proxies[f"zk-{d.master}"].enable()
    d.healed()
    d.say(f"  {d.master} reaches ZooKeeper again")
    d.cluster.wait_role(d.master, "worker")


def zk_drop_master(d: Drill) -> None:
    """The master's ZooKeeper packets dropped in the kernel (nftables, in the drill's own network
    namespace): its connection goes silent instead of closing; it must stop writing before the
    worker starts, and come back as worker."""
    from .kernel_faults import PortDrops

    drops = PortDrops()
    port = int(d.cluster.proxies[f"zk-{d.master}"].listen.rsplit(":", 1)[1])
    d.wait_sent(0.4)
    d.fault(f"drop {d.master}'s ZooKeeper packets (nftables)", lasts=True)
    try:
        drops.drop(port)
        d.cluster.wait_role(d.worker, "master")
    finally:
        drops.heal()
    d.healed()
    d.say(f"  {d.master}'s ZooKeeper packets pass again")
    d.cluster.wait_role(d.master, "worker")


def redis_restart(d: Drill) -> None:
    """Redis stopped (it writes its append-only file) and started again under load."""
    d.wait_sent(0.4)
    d.fault("stop Redis", lasts=True)
    d.cluster.services.stop_redis()
    time.sleep(2.0)  # the outage: how long Redis stays down
    d.cluster.services.start_redis_again()
    d.healed()
    d.say("  Redis is back")
    wait_for(d.cluster.master, 60, 0.2)


def kill_during_rollback(d: Drill) -> None:
    """The master killed; the worker killed the moment it takes the new epoch, when it starts
    delivering what the old master left (its catch-up); the first peer, restarted, finishes."""
    from ..cluster.connect import connect_zookeeper

    a, b = d.master, d.worker
    # Directly, not through a peer's proxy; with the peers' credentials
    # (TWINFLOW_ZK_AUTH), without which a protected flow's epoch cannot be read.
    zk = connect_zookeeper(d.cluster.zk_hosts, 10, session_timeout_s=10.0)
    try:
        epoch_path = ZkPaths(d.cluster.flow).epoch
        epoch = zk.exists(epoch_path).version
        killed = threading.Event()

        def on_epoch(data, stat):  # b takes the new epoch in ZooKeeper first, then catches up
            if stat is not None and stat.version > epoch and not killed.is_set():
                d.cluster.peers[b].kill()
                d.fault(f"SIGKILL {b} as it takes over")
                killed.set()
                return False  # no more calls
            return True

        d.wait_sent(0.5)
        zk.DataWatch(epoch_path, on_epoch)
        d.fault(f"SIGKILL master {a}")
        d.cluster.peers[a].kill()
        if not killed.wait(60):
            raise RuntimeError(f"{b} was not promoted:\n{d.cluster.logs()}")
    finally:
        zk.stop()
        zk.close()
    d.say(f"  {b}'s last status: {d.cluster.status(b).get('rolled_back', '?')} caught up")
    d.cluster.restart(a)
    d.cluster.wait_role(a, "master")


def zk_member_restart(d: Drill) -> None:
    """On a three-server ZooKeeper ensemble, the server that leads it killed and started again:
    the ensemble elects another leader, the peers' clients move to a live member."""
    ensemble = d.cluster.ensemble
    d.wait_sent(0.4)
    leader = ensemble.leader()
    if leader is None:
        raise RuntimeError("the ZooKeeper ensemble has no leader")
    d.fault(f"SIGKILL ZooKeeper server {leader + 1}, the ensemble's leader", lasts=True)
    ensemble.kill(leader)
    ensemble.wait_serving(60)
    d.say(f"  the ensemble serves again (leader: server {(ensemble.leader() or 0) + 1})")
    ensemble.start_again(leader)
    d.healed()
    d.say(f"  ZooKeeper server {leader + 1} is back")
    if not wait_for(d.cluster.master, 60, 0.2):
        raise RuntimeError(f"no master after the ZooKeeper restart:\n{d.cluster.logs()}")


def redis_failover(d: Drill) -> None:
    """Redis with Sentinel (a primary, two replicas, three Sentinels): the primary SIGKILLed under
    load; the Sentinels promote a replica and the peers follow it."""
    ha = d.cluster.ha
    d.wait_sent(0.4)
    old = ha.primary()
    if old is None:
        raise RuntimeError("the Sentinels name no primary before the fault")
    d.fault(f"SIGKILL the Redis primary (127.0.0.1:{ha.servers[old].port})", lasts=True)
    ha.kill(old)
    new = wait_for(lambda: (lambda p: p if p not in (None, old) else None)(ha.primary()), 60, 0.05)
    if new is None:
        raise RuntimeError(f"the Sentinels promoted no replica within 60 s:\n{ha.logs()}")
    d.healed()
    d.say(f"  the Sentinels promoted 127.0.0.1:{ha.servers[new].port}")
    if not wait_for(d.cluster.master, 60, 0.2):
        raise RuntimeError(f"no master after the Redis failover:\n{d.cluster.logs()}")


def redis_cluster_failover(d: Drill) -> None:
    """A three-primary Redis Cluster with a replica each: the primary that owns the flow's slot
    SIGKILLed under load; its replica takes the slot over (the cluster's own failover); the
    killed server is started again and rejoins as the new primary's replica."""
    cl, key = d.cluster.ha, d.cluster.keys.uplink
    d.wait_sent(0.4)
    old = cl.owner(key)
    d.fault(f"SIGKILL the Redis Cluster primary of the flow's slot (127.0.0.1:{cl.servers[old].port})", lasts=True)
    cl.kill(old)
    new = wait_for(lambda: (lambda o: o if o != old else None)(cl.owner(key)), 60, 0.05)
    if new is None:
        raise RuntimeError("no replica took the flow's slot over within 60 s")
    d.healed()
    d.say(f"  127.0.0.1:{cl.servers[new].port} owns the slot; starting the killed server again")
    cl.start_again(old)
    if not wait_for(lambda: old in cl.replicas_of(new), 60, 0.1):
        raise RuntimeError("the killed server did not rejoin as a replica within 60 s")
    d.say("  it rejoined as a replica")
    if not wait_for(d.cluster.master, 60, 0.2):
        raise RuntimeError(f"no master after the Redis Cluster failover:\n{d.cluster.logs()}")


DRILLS: dict[str, Callable[[Drill], None]] = {
    "kill-master": kill_master,
    "kill-in-handler": kill_in_handler,
    "resubmit-in-failover": resubmit_in_failover,
    "pause-master": pause_master,
    "escalation-cut": escalation_cut,
    "escalation-latency": escalation_latency,
    "redis-latency": redis_latency,
    "worker-crash": worker_crash,
    "double-failover": double_failover,
    "zk-partition-master": zk_partition_master,
    "redis-restart": redis_restart,
    "kill-during-rollback": kill_during_rollback,
    "zk-member-restart": zk_member_restart,
    "zk-drop-master": zk_drop_master,
    "redis-failover": redis_failover,
    "redis-cluster-failover": redis_cluster_failover,
}
# The drills of a guarded handler: they run the guarded flow (guarded_drills.py), at its rate.
# Which drills apply to a flow given with --flow: drill_fit.py.
GUARDED = drill_fit.GUARDED
# The drills on a Redis with replicas, and which (see LocalCluster's redis_mode).
REDIS_HA = {"redis-failover": "sentinel", "redis-cluster-failover": "cluster"}
# The drills that run on a three-server ZooKeeper ensemble (the others on one server).
ON_ENSEMBLE = {"zk-member-restart"}
# The drills that need their own network namespace (kernel faults; twinflow drill makes one).
IN_NETNS = {"zk-drop-master"}
# The drills whose recovery time is held to the target: they kill the master and leave a
# peer to take over (kill-during-rollback kills both; its recovery includes a restart).
KILLS_MASTER = set(DRILLS) - {"zk-partition-master", "redis-restart", "kill-during-rollback", "zk-member-restart",
                              "zk-drop-master", *REDIS_HA}


# -- running one ------------------------------------------------------------------------------------
class FlowProducer(PacedProducer):
    """The drill producer for a flow of its own fields: publishes ``source.doc(seq)``
    (twinflow/testing/flow_messages.py) through ``cluster.publish`` at ``rate``, and remembers
    each message's ID where the flow keeps it; waits while ``gate`` is clear, as DrillProducer."""

    def __init__(self, cluster: LocalCluster, source, total: int, rate: float, gate: threading.Event,
                 batch: int = 50):
        super().__init__("drill-producer", cluster.publish, source.doc, total, rate, batch, gate, id_of=source.id_of)


def run_drill(name: str, seed: int = 1, messages: int = 10_000, flow_text: str | None = None,
              rate: float = 1000.0, settle_s: float = 90.0, say: Callable[[str], None] = lambda text: None,
              keep: bool = False, wait_replicas: int | None = None, samples: list[dict] | None = None,
              books_in_ledger: bool = False) -> dict:
    """Run one drill on a fresh cluster and check it; returns the result (see the module docstring).

    ``wait_replicas``: the flow's ``cluster.wait_replicas`` (and the producer's WAIT) for the
    Redis failover drills; None: 1 for them, the flow's own for the others. ``samples``:
    example messages for a ``flow_text`` whose messages cannot all be made up (CannotGenerate,
    raised before anything starts, names the field). ``books_in_ledger``: ``flow_text``'s
    handler is the ledger's (drill_fit.books_in_ledger), so that any drill of it makes the ledger
    and puts the handler module beside the flow, as the guarded drills always do, and checks the
    ledger too."""
    if name not in DRILLS:
        raise KeyError(f"unknown drill {name!r} (known: {', '.join(DRILLS)})")
    workdir = Path(tempfile.mkdtemp(prefix="twinflow-cluster-"))
    ledger = None
    if name in GUARDED or books_in_ledger:
        ledger = guarded_drills.prepare(workdir)  # the handler module next to the flow, before it is parsed
        flow_text = flow_text or guarded_drills.GUARDED_FLOW.read_text()
        sys.path.insert(0, str(workdir))
    source = messages_for(parse_graph(flow_text, "drill flow"), samples) if flow_text else CHAINED_MESSAGES
    flow_text = flow_text or CHAINED.read_text()
    if name in REDIS_HA and wait_replicas is None:
        wait_replicas = 1
    if wait_replicas is not None:
        flow_text = with_wait_replicas(flow_text, wait_replicas)
    cluster = LocalCluster(str(workdir), flow="drill", text=flow_text, peers=("a", "b"), proxied=True,
                           zk_members=3 if name in ON_ENSEMBLE else 1, redis_mode=REDIS_HA.get(name, "single"),
                           wait_replicas=wait_replicas or 0).start()
    try:
        master = cluster.wait_ready()
        worker = cluster.other(master)
        wait_for(lambda: cluster.status(worker).get("streaming") == "1", 120, 0.2)
        gate = threading.Event()
        producer = DrillProducer(cluster, messages, rate, gate) if source is CHAINED_MESSAGES else \
            FlowProducer(cluster, source, messages, rate, gate)
        drill = Drill(cluster, master, worker, random.Random(seed), lambda: len(producer.ids), messages, say=say,
                      producing=gate)
        if name == "resubmit-in-failover":  # the ledger refuses every 7th message until it is resubmitted
            guarded_drills.refuse(ledger, [source.id_of(source.doc(i)) for i in range(messages)
                                           if i % guarded_drills.REFUSE_EVERY == 3])
        producer.start()
        DRILLS[name](drill)
        producer.join(timeout=messages / rate + 120)
        if producer.error is not None:
            raise RuntimeError(f"the producer failed: {producer.error}")
        checker.wait_judged(cluster.outputs, producer.ids, settle_s)
        if name == "resubmit-in-failover":
            resubmitted = _settle_resubmits(cluster, settle_s, say)
            outputs = guarded_drills.without_resubmitted(cluster.outputs(), cluster.redis, cluster.keys)
            result = verdict(checker.check(outputs, producer.ids, drill.faults), kills_master=True)
            result["resubmit"] = resubmitted
            result["passed"] = result["passed"] and guarded_drills.resubmit_kept(resubmitted)
        else:
            result = check(cluster, producer.ids, drill.faults, kills_master=name in KILLS_MASTER)
        result.update(drill=name, seed=seed, messages=messages)
        if ledger is not None:
            result["ledger"] = guarded_drills.ledger_verdict(ledger)
            result["passed"] = result["passed"] and guarded_drills.ledger_kept(result["ledger"])
        if name in REDIS_HA:
            result["wait_replicas"] = wait_replicas
            out = {m for entries in cluster.outputs().values() for e in entries for m in e.id.split("+")}
            lost = set(producer.ids) - out
            result["lost_in_uplink"] = len(lost - cluster.uplink_ids()) if lost else 0
        result["timeline"] = timeline(cluster.outputs(), drill.windows)
        result["rerun"] = f"twinflow drill {name} --seed {seed} --messages {messages}" + (
            f" --wait-replicas {wait_replicas}" if name in REDIS_HA else "")
        if not result["passed"]:
            result["logs"] = cluster.logs(20)
        return result
    finally:
        cluster.stop()
        if not keep:
            cluster.remove()


def _settle_resubmits(cluster: LocalCluster, settle_s: float, say: Callable[[str], None]) -> dict:
    """After the stream: resubmit what failed since the first resubmit, and wait until every
    resubmitted entry has its outcome; the audit's verdict (guarded_drills.resubmit_verdict)."""
    say(f"  after the stream: {_resubmit_all(cluster)}")
    keys = cluster.keys

    def settled():
        v = guarded_drills.resubmit_verdict(cluster.redis, keys)
        return v if v["outcomes"] >= v["resubmitted"] else None

    return wait_for(settled, settle_s, 0.5) or guarded_drills.resubmit_verdict(cluster.redis, keys)


def check(cluster: LocalCluster, sent: list[str], faults: list[float], kills_master: bool) -> dict:
    """The promises, counted over every outlink by the one checker (see the module docstring)."""
    return verdict(checker.check(cluster.outputs(), sent, faults, sequences=cluster.sequences()), kills_master)


def verdict(report: checker.SinkReport, kills_master: bool) -> dict:
    """A checker's report as a drill's result: its counts, and passed when every promise is
    kept and, for a drill that kills the master, the recovery is under the target."""
    rto = report.rto_s
    passed = report.promises_kept and (not kills_master or (rto is not None and rto < RTO_TARGET_S))
    return {"lost": report.lost, "duplicated": report.duplicated, "out_of_order": report.out_of_order,
            "stale_writes": report.stale_writes + report.two_writers,
            "rto_s": None if rto is None else round(rto, 3), "passed": passed,
            "lost_ids": report.lost_ids, "duplicated_ids": report.duplicated_ids}


def with_wait_replicas(flow_text: str, n: int) -> str:
    """The flow file with ``cluster.wait_replicas: n`` (replica_wait_ms 500 unless set)."""
    import yaml

    doc = yaml.safe_load(flow_text)
    cluster = doc.setdefault("cluster", {}) or {}
    cluster["wait_replicas"] = n
    cluster.setdefault("replica_wait_ms", 500)
    doc["cluster"] = cluster
    return yaml.safe_dump(doc, sort_keys=False)
