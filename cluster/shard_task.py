"""One uplink shard's batch, run on the Spark executor that read it.

A sharded flow's peer (``shard_reading``) plans each micro-batch on its driver:
per shard, the role this peer has there and its epoch (:class:`ShardPlan`).
Spark then runs :func:`run_partition` in the task that reads the shard's
partition, on an executor, with a Redis connection of its own:

- master: the flow's deadlines due are fired, then the batch is run in
  fenced COMMIT steps (``master_session``), exactly as a driver-side master
  runs it; the result carries the claims to escalate, the counts, the next
  deadline, and anything not committed. The flow is the one this process
  kept from the shard's previous batch when still valid (below), else it is
  loaded from Redis: loading reads all of the shard's node state, so doing
  it for every batch would cost more the longer the flow runs;
- worker: which messages the flow already processed (one round trip that
  also records how far this peer handled the shard), for the driver's bake;
- otherwise (the peer is starting, or a master whose ZooKeeper session is
  suspended must hold the batch): the rows go back to the driver, which
  decodes them and decides there.

Bad entries go to the shard's failure stream here, once, with their reason.

When a kept flow is used: it was kept at the same epoch and the driver has
committed no step of its own for the shard since (the plan's ``generations``:
a driver-side step, a time-out fired with no batch coming or a promotion's
catch-up). That only saves a wasted round; what makes a kept flow safe is the
state version every COMMIT checks: a step built on a flow another writer has
moved since (a batch the shard ran in another executor process, a second
attempt of this task running at the same time, a timer step that moved no
mark) is refused with nothing written, and the flow is loaded again.

Under failure: a master step refused by the fence (a newer master exists)
or over the write lease without Redis ends the run at that step; what was
not committed comes back in ``msgs`` with ``fenced_by`` or ``unreachable``
set, and the driver steps down and bakes it. Any other error fails the task
(Spark retries it, then fails the query): the batch is not committed and is
read again, and every step that did commit is recognised as processed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections import Counter
from dataclasses import dataclass, field
from concurrent.futures import Executor
from typing import Any, Callable, Iterator, TYPE_CHECKING

from ..runtime.flowgraph import FlowGraph, parse_graph
from ..runtime.message import Message
from ..runtime.shards import shard_graph
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.store_errors import Fenced, RedisUnavailable
from .master_flow import MasterFlow
from .master_outcome import Outcome
from .master_session import MasterSession
from .write_pool import write_pool
from .uplink_rows import decode_rows, last_position, processed_as_worker, record_bad

if TYPE_CHECKING:
    from .escalation_servicer import Claim

MASTER, WORKER = "master", "worker"
RESULT_SCHEMA = "result binary"


@dataclass(frozen=True)
class ShardPlan:
    """What the driver decided for one micro-batch, shipped to every task of it."""

    flow_text: str
    flow_source: str
    redis_url: str
    peer_id: str
    now: float                          # the flow's time for this batch (the driver's clock)
    connect_deadline_s: float
    roles: dict[int, tuple[str, int]]   # shard -> (role, epoch)
    generations: dict[int, int] = field(default_factory=dict)  # shard -> driver-side steps so far
    packed: bool = False                # the frame's rows are packed (shard_source "Packed rows")


@dataclass
class ShardResult:
    shard: int
    role: str = "driver"
    epoch: int = 0
    last: str | None = None             # the batch's last uplink position (None: no entries)
    warm: bool = False
    failed: int = 0
    delivered: int = 0
    skipped: int = 0
    msgs: list[Message] = field(default_factory=list)  # worker: to bake; master: not committed (no doc)
    rows: list[tuple] = field(default_factory=list)     # "driver": the rows as read, to decode there
    done: list[bool] = field(default_factory=list)      # worker: processed already, per message
    claims: list[Claim] = field(default_factory=list)
    next_deadline: float | None = None
    fenced_by: int = 0                  # the newer epoch that refused a step
    unreachable: str = ""               # why Redis did not take a step in time
    pid: int = field(default_factory=os.getpid)  # the executor process that ran it
    state_loads: int = 0                # times this batch loaded the shard's whole state from Redis
    read: int = 0                       # uplink entries in the batch (the peer's metrics)
    left: Counter = field(default_factory=Counter)  # committed steps' outputs per stream (the peer's metrics)

    # What travels back is what the driver uses: a message to bake needs its ID, key,
    # position, body, ruleset and claim ID, not its parsed document (pickling that cost more
    # than the batch).
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["msgs"] = [(m.id, m.key, m.position, m.body, m.rule, m.cid) for m in self.msgs]
        return state

    def __setstate__(self, state: dict) -> None:
        state["msgs"] = [Message(i, k, p, b, {}, r, c) for i, k, p, b, r, c in state["msgs"]]
        self.__dict__.update(state)


class _Context:
    """Per executor process and flow: the parsed flow and one store per shard, made once."""

    def __init__(self, plan: ShardPlan, open_store: "Callable[[ShardPlan, FlowGraph], FlowStore]"):
        self.graph: FlowGraph = parse_graph(plan.flow_text, plan.flow_source)
        self.plan = plan
        self._open_store = open_store
        self.stores: dict[int, tuple[FlowGraph, FlowStore]] = {}
        self.flows: dict[int, tuple[int, int, MasterFlow]] = {}  # shard -> (epoch, generation, flow)

    def shard(self, k: int) -> tuple[FlowGraph, FlowStore]:
        if k not in self.stores:
            graph = shard_graph(self.graph, k)
            self.stores[k] = (graph, self._open_store(self.plan, graph))
        return self.stores[k]


def open_shard_store(plan: ShardPlan, graph: FlowGraph) -> FlowStore:
    """A shard's store on the Redis the plan names (waiting for it up to the plan's deadline)."""
    from .on_cluster import flow_keys
    from .connect import open_store

    return open_store(plan.redis_url, plan.connect_deadline_s, flow_keys(graph), plan.peer_id, graph.cluster)


class TaskProcess:
    """What one executor process keeps across the tasks it runs: per flow (and peer), the parsed
    flow, a store per shard (``open_store(plan, shard_graph)``) and the flows kept from each
    shard's last batch; and where its masters' COMMITs go from (``writes()``).

    A real executor has one, :data:`PROCESS`, with stores on the plan's Redis and the writer
    pool of ``master_session``; a simulator gives each simulated executor process its own.
    Lost with the process: what it keeps is a cache, every COMMIT checks the state version."""

    def __init__(self, open_store: "Callable[[ShardPlan, FlowGraph], FlowStore]" = open_shard_store,
                 writes: "Callable[[], Executor]" = write_pool):
        self.open_store = open_store
        self.writes = writes
        self.contexts: dict[tuple, _Context] = {}

    def context(self, plan: ShardPlan) -> _Context:
        key = (hashlib.sha256(plan.flow_text.encode()).hexdigest(), plan.redis_url, plan.peer_id)
        if key not in self.contexts:
            self.contexts[key] = _Context(plan, self.open_store)
        return self.contexts[key]


PROCESS = TaskProcess()


def run_partition(plan: ShardPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: the partition's rows (shard, position, data, size) in, one pickled
    :class:`ShardResult` per shard out."""
    import pyarrow as pa

    for k, shard_rows in partition_rows(batches, plan.packed).items():
        result = run_shard(plan, k, shard_rows)
        yield pa.RecordBatch.from_pydict({"result": [pickle.dumps(result)]}, schema=pa.schema([("result", pa.binary())]))


def partition_rows(batches: Iterator[Any], packed: bool = False) -> dict[int, list[tuple]]:
    """A partition's Arrow batches (shard, position, data, size) as ``{shard: [(position, data,
    size), ...]}``, each shard's rows in uplink order, unpacked when ``packed`` (also what the
    bare sharded passthrough of ``bench/shards.py`` reads with, so it measures the same path)."""
    from ..runtime.spark.packed_rows import unpack_rows

    rows: dict[int, list[tuple]] = {}
    for batch in batches:
        shards, positions, bodies, sizes = (batch.column(i).to_pylist() for i in range(4))
        if packed:
            for k, p, d, n in zip(shards, positions, bodies, sizes):
                rows.setdefault(k, []).extend(unpack_rows([p], [d], [n]))
            continue
        for k, p, d, n in zip(shards, positions, bodies, sizes):
            rows.setdefault(k, []).append((p, d, n))
    return rows


def run_shard(plan: ShardPlan, k: int, rows: list[tuple], process: TaskProcess | None = None) -> ShardResult:
    """One shard's rows as this peer's role there says (see the module doc), in ``process``
    (default: this executor process's, :data:`PROCESS`)."""
    if k < 0:  # the query's warm-up row
        return ShardResult(shard=k, warm=True)
    process = process or PROCESS
    ctx = process.context(plan)
    graph, store = ctx.shard(k)
    spec = graph.cluster
    role, epoch = plan.roles.get(k, ("driver", 0))
    msgs, bad, _ = decode_rows(rows, spec.message)
    r = ShardResult(shard=k, role=role, epoch=epoch, last=last_position(rows), read=len(msgs) + len(bad))
    if bad:
        record_bad(store, spec, bad)
        r.failed = len(bad)
    if r.last is None:
        return r
    if role == WORKER:
        r.msgs, r.done = processed_as_worker(store, msgs, r.last, spec)
        return r
    if role != MASTER:
        r.rows = rows
        return r
    generation = plan.generations.get(k, 0)
    cached = ctx.flows.pop(k, None)
    # The flow this process kept from the shard's last batch it ran, if nothing but
    # executors' batches changed the shard since (same epoch, no driver-side step):
    # a batch that ran in another process moved the mark, so the first guarded
    # COMMIT finds this flow behind and the session reloads it (master_session).
    kept = cached[2] if cached is not None and cached[:2] == (epoch, generation) else None
    session = MasterSession(graph, store, epoch, process.writes(), flow=kept, left=r.left)
    try:
        if not _fire_due(session, plan.now, r):
            r.msgs = msgs
            return r
        out = session.run_batch(msgs, r.last, lambda: plan.now)
        _take(r, out)
        r.msgs = out.rest or []
        if session.flow is not None:
            ctx.flows[k] = (epoch, generation, session.flow)
            r.next_deadline = session.next_deadline()
        return r
    finally:
        r.state_loads += session.state_loads


def _fire_due(session: MasterSession, now: float, r: ShardResult) -> bool:
    """Fire the deadlines due at ``now`` before the batch, as a driver-side master's timer
    would have (loading the flow if there is none); False when a write was refused."""
    try:
        due = session.load().next_deadline()
    except RedisUnavailable as exc:
        _take(r, Outcome(refused=exc))
        return False
    if due is None or due > now:
        return True
    out = session.fire(now, guess=True)  # a kept flow behind Redis fires again on a fresh one
    _take(r, out)
    return out.refused is None


def _take(r: ShardResult, out: Outcome) -> None:
    """Put what a session did in the task's result, for the driver to act on."""
    r.delivered += out.delivered
    r.skipped += out.skipped
    r.failed += out.failed
    r.claims.extend(out.claims)
    if isinstance(out.refused, Fenced):
        r.fenced_by = out.refused.newest
    elif out.refused is not None:
        r.unreachable = str(out.refused)
