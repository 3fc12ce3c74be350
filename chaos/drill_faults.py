"""The local drills' faults, one function of a :class:`~.drill_record.Drill` each, and
:data:`DRILLS`, each function by its name on the command line (``twinflow drill NAME``), with
the sets that say how :func:`~.drills.run_drill` sets a drill up: on the guarded flow, on a
Redis with replicas, on a three-server ZooKeeper ensemble, in a network namespace of its own,
and whether its recovery is held to the target.

A drill function waits until its share of the messages went out, injects its fault (the time
it did so is what its recovery is measured from), and returns once the cluster has a master
again; the checker judges what came out (:mod:`.drills`).

Under failure: a drill that cannot bring about what it names (the peer to kill no longer
master, no ensemble leader, no replica promoted, a producer that stalls) raises RuntimeError
saying what it waited for, with the cluster's logs where they tell why, rather than judge a
fault that did not happen. Every wait has a deadline; the kernel drops of ``zk-drop-master``
are lifted in a ``finally``, also when the drill fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ..cluster.zk_paths import ZkPaths
from ..runtime.waiting import wait_for
from ..testing.local_cluster import LocalCluster
from . import drill_fit, guarded_drills
from .drill_record import Drill


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
    d.say(f"  {resubmit_all(cl)}")
    cl.wait_role(d.worker, "master")


def resubmit_all(cluster: LocalCluster) -> str:
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
