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

Each drill's fault is a function in :mod:`.drill_faults` (:data:`~.drill_faults.DRILLS`, by
name); what a drill is given and what it keeps of its faults is in :mod:`.drill_record`.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from ..runtime.waiting import wait_for
from ..runtime.flowgraph import parse_graph
from ..testing.flow_messages import CHAINED_MESSAGES, messages_for
from ..testing.messages import CHAINED
from ..testing.producers import DrillProducer, PacedProducer
from ..testing import checker
from ..testing.local_cluster import LocalCluster
from . import guarded_drills
from .drill_faults import DRILLS, GUARDED, KILLS_MASTER, ON_ENSEMBLE, REDIS_HA, resubmit_all
from .drill_record import Drill
from .report import timeline

RTO_TARGET_S = 3.0


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
    say(f"  after the stream: {resubmit_all(cluster)}")
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
