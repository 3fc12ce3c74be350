"""One flow node of an active-active pair: master or worker, and the switch between them.

Every node reads the whole uplink through Spark. What it does with a batch
depends on its role:

- master: the flow graph (the same nodes as ``twinflow replay``, see
  ``master_flow.py``) takes each message the flow has not processed yet;
  what left through its outlinks, the node state it changed, the IDs and
  the processed mark are written in one fenced Redis step; then the
  processed messages (id, key, uplink position) are escalated to the others;
- worker: with a claim pair, messages the flow already processed (ID in the
  ID cache, or at or before the processed mark) leave through bypass and the
  rest bake in the pair's claim-mode sort until an escalation claims them;
  without one, the worker only records how far it has read.

The rule that makes a message processed: the commit of the step that ran it
also moves the processed mark, the position up to which the masters handled
every uplink entry, in uplink order (``master_flow.py`` says it per node).

Promises under failure (DESIGN.md's numbering):

- Promotion (1, 2): the new master takes a new epoch, raises the fencing
  epoch in Redis, then delivers every uplink entry after the processed mark
  up to where it has read itself, re-read from the uplink, not from memory:
  what it had baked before a restart, or never baked because its offset
  skipped ahead, is delivered all the same, and anything already processed
  is skipped by the delivery script. Its bake is dropped only once that
  succeeded; an error leaves everything in Redis and the election queues the
  node again.
- Batches (1): a batch is either processed whole (delivered, baked or sent to
  the failure stream) or ``on_batch`` raises, so Spark does not commit it and
  reads it again: a node stopping with a batch held (ZooKeeper suspended,
  Redis down) never drops it. Each worker batch records how far the node has
  handled the uplink (``handled_id``) before Spark commits it.
- Batches run ahead (1): a master's batch runs on the node's batch thread
  while Spark commits it and plans and reads the next (a micro-batch's own
  cycle, 100-200 ms, no longer waits for the flow). Before ``on_batch``
  returns, the node records ``handled_id`` past the batch in Redis, so Spark's
  commit is never ahead of it: if the process dies with the batch half done,
  whichever node is promoted next delivers every entry after the processed
  mark up to its own ``handled_id`` (this node's, should it be the one),
  re-read from the uplink, and the other node reads the batch itself. The
  next batch waits for the one ahead (one at a time, in order, holding the
  node's batch lock as before); if it failed, the next batch raises, so
  Spark commits nothing more, and the node stops with exit code 1.
- One writer (3): a stale master's delivery is refused (Fenced); it steps
  down and bakes instead. The node lock guards memory only and is never held
  across a Redis call, so handover and status answer while Redis hangs.
- Write lease (1, 3): a master that has not reached Redis for
  ``write_lease`` seconds (shorter than its ZooKeeper session) steps down,
  and queues for the election again only once Redis answers, so a node that
  can reach Redis takes over.
- Bounded state (5): a worker stops reading (backpressure) when another
  batch could take it past ``max_pending``; it never drops. The sweep that
  frees surfaced messages costs one Redis read whatever it holds.
- Bad input (6): every entry that cannot be decoded goes to the failure
  stream with its reason, once, whichever node sees it first.
- Timers (node deadlines on the master, bake expiry, sweep, status, lease)
  run on their own thread, so they fire with no new input; idle, that thread
  wakes a few times a second. A master fires the deadlines in the state it
  loaded, so the old master's pending time-outs fire too (promise 4). One
  round is ``timer_round()``: the failover simulator (``chaos/sim``) calls
  it in its own steps, on its virtual clock, instead of the thread.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.clock import Clock, SystemClock
from ..runtime.flowgraph import FlowGraph
from ..runtime.message import Message, position_order
from ..runtime.nodes.sort import ClaimSortNode
from ..runtime.store.flow_store import FlowKeys, FlowStore, Fenced, RedisUnavailable
from ..grpc_security import NO_SECURITY, GrpcSecurity
from ..logs import event
from ..secrets import redact_url
from .escalation import EscalationSender, StaleEpoch
from .health import NodeHealth
from .leadership import Leadership, MembersUnknown
from .master_flow import MasterFlow, not_on_cluster
from .master_steps import commit_one, run_master_batch
from .metrics import LATENESS_BUCKETS, BatchTimings, MetricsServer, Timings, serve as serve_metrics
from .node_parts import NodeParts, RealParts
from .uplink_rows import decode_rows, last_position, processed_as_worker, record_bad

if TYPE_CHECKING:
    from .shard_task import ShardResult

log = logging.getLogger("twinflow.node")

MASTER, WORKER, STARTING = "master", "worker", "starting"
# A sharded flow's master fires a time-out itself once this long has passed without a batch
# (whose executor would have fired it): the most a time-out waits for that under no load.
REMOTE_FIRE_AFTER_S = 0.25
BUSY_RETRY_S = 0.05  # how soon the timer looks again at a deadline a batch in progress holds up


class NodeStopping(RuntimeError):
    """A batch reached the node while it stops: raised so that Spark does not commit it."""


class StartRefused(RuntimeError):
    """The node will not start: reading from here, or on this Redis, could break a promise."""


class _StepDown(RuntimeError):
    """The node stopped being master while it was catching up on promotion."""


class NoPair:
    """The worker's side of a flow without a claim pair: nothing bakes, nothing is claimed."""

    pending = baked = claimed = unclaimed = rolled_back = 0

    def offer(self, msg, now, processed=False):
        return None

    def claim(self, msg_id, key, position):
        return []

    def take_claims(self, claims):
        return []

    claimed_messages = settle_claims = staticmethod(lambda *args: [])

    def tick(self, now):
        return []

    def next_deadline(self):
        return None

    def release_upto(self, position):
        return 0

    def rollback(self):
        return []


@dataclass
class NodeConfig:
    node_id: str
    redis_url: str
    zk_hosts: str
    listen: str = "127.0.0.1:0"
    advertise: str | None = None      # the address other nodes dial; default: the bound one
    spark_master: str = "local[1]"
    spark_conf: dict | None = None    # further Spark settings (--spark-conf)
    state_dir: str = ".twinflow"
    connect_deadline_s: float = 60.0
    status_interval_s: float = 0.5
    sweep_interval_s: float = 1.0
    trim_interval_s: float = 10.0     # how often the master trims the uplink (uplink.retention)
    worker_pace_ms: int = 250         # a worker plans a batch at most this often (the master: at once)
    start_from: str | None = None     # a new state dir on a processed flow: "processed" or "beginning"
    security: GrpcSecurity = NO_SECURITY  # gRPC TLS and tokens, served and used to escalate
    metrics_listen: str | None = None  # HOST:PORT of the node's Prometheus metrics (HTTP), or none


def run_until_stopped(node, is_master) -> int:
    """Start ``node`` (a FlowNode or a ShardedNode) and run it until stopped: 0 after a stop or
    a SIGTERM, which hands over first while ``is_master()``; 1 when its uplink stream died."""
    node.start()
    while not node._stop.is_set():
        if node._term_requested.is_set():
            if is_master():
                try:
                    result = node.handover(5.0)
                    event(log, logging.INFO, "handover", "SIGTERM handover: %s", result, flow=node.name,
                          node=node.cfg.node_id, ok=bool(result.get("ok")), new_master=result.get("new_master"),
                          reason=result.get("reason"))
                except Exception:  # ZooKeeper unreachable: stop all the same
                    event(log, logging.ERROR, "handover", "SIGTERM handover failed; stopping", flow=node.name,
                          node=node.cfg.node_id, ok=False, exc_info=True)
            break
        if node.query is not None and not node.query.isActive:
            event(log, logging.ERROR, "stream_stopped", "the uplink stream stopped: %s", node.query.exception(),
                  flow=node.name, node=node.cfg.node_id)
            node.stop()
            return 1
        if node.batch_error is not None:  # a batch that ran ahead failed (FlowNode.on_batch)
            node.stop()
            return 1
        node._stop.wait(0.1)
    node.stop()
    return 0


def start_metrics(cfg: NodeConfig, nodes, server, flow: str, frames=None) -> MetricsServer:
    """Serve the metrics of ``nodes`` (a FlowNode, or a sharded node's shards) on
    ``cfg.metrics_listen``; StartRefused when that address cannot be bound."""
    try:
        metrics = serve_metrics(cfg.metrics_listen, nodes, server=server, frames=frames)
    except (OSError, ValueError) as exc:
        raise StartRefused(f"cannot serve metrics on {cfg.metrics_listen}: {exc}") from exc
    event(log, logging.INFO, "metrics", "%s serves Prometheus metrics on http://%s/metrics (unauthenticated)",
          cfg.node_id, metrics.address, flow=flow, node=cfg.node_id, address=metrics.address)
    return metrics


def cluster_flow(graph: FlowGraph):
    """The flow's cluster sections; StartRefused when the flow cannot run on the cluster."""
    if graph.cluster is None:
        raise StartRefused(f"{graph.source}: flow {graph.name!r} has no uplink section, so it runs in "
                           f"replay only (README 'Flow files')")
    local = not_on_cluster(graph)
    if local:
        raise StartRefused(f"{graph.source}: these nodes keep their state in one process only so far and "
                           f"run in replay only: {', '.join(local)}")
    return graph.cluster


def flow_keys(graph: FlowGraph) -> FlowKeys:
    """The flow's Redis keys: its uplink, and as its sink the paired action's (or the only action's)."""
    spec = graph.cluster
    actions = [n for n in graph.nodes.values() if getattr(n, "sink", None)]
    pair_action = graph.nodes.get(spec.pair.action) if spec and spec.pair else None
    sink = getattr(pair_action, "sink", None) or (actions[0].sink if len(actions) == 1 else None)
    return FlowKeys(graph.name, spec.uplink_stream if spec else "uplink", sink or "sink")


class FlowNode:
    def __init__(self, graph: FlowGraph, config: NodeConfig, clock: Clock | None = None,
                 parts: NodeParts | None = None, monotonic=time.monotonic, pause=None):
        """``parts`` builds the node's collaborators (default: real servers and Spark, see node_parts);
        ``clock`` gives the flow's time, ``monotonic`` the timers' local intervals and ``pause(s)``
        the wait of a held batch (default: until stopped); a simulator passes its virtual clock."""
        spec = cluster_flow(graph)
        self.parts = parts or RealParts()
        self.writes = self.parts.writes()  # where the master's COMMITs go from (master_steps)
        self.ahead = self.parts.batches_ahead()  # where a master's batch runs ahead of Spark (or None)
        self._ahead: Future | None = None     # the batch running ahead, if any
        self.batch_error: BaseException | None = None  # why a batch that ran ahead failed
        self.graph = graph
        self.spec = spec
        self.name = graph.name
        self.cfg = config
        self.clock = clock or SystemClock()
        self.monotonic = monotonic
        self._next_status = self._next_sweep = self._next_trim = float("-inf")
        pair = spec.pair
        self.keys = flow_keys(graph)
        self.sort = ClaimSortNode(pair.bake_time, pair.unclaimed_outlink, pair.max_pending) if pair else NoPair()
        self.flow: MasterFlow | None = None   # the master's graph, a cache of its state in Redis
        self.open_in_flow = 0  # what the flow held open after the last step (status reads this, not the flow)
        self.remote_deadline: float | None = None  # the flow's next deadline, as an executor's batch left it
        self.remote_batch_at = float("-inf")  # monotonic time of the last batch an executor ran as master
        self.driver_steps = 0     # steps this node committed itself (an executor's kept flow is then stale)
        self.task_pid = 0         # the process that ran this shard's last batch (a sharded flow's executor)
        self.state_loads = 0      # whole-state loads executors made for this shard's batches
        # A batch never takes the bake past max_pending: the reader takes at
        # most max_read_size entries (read_size under light load, growing under
        # a backlog; a quarter of max_pending at most, so that the bake can
        # hold a few big batches), and holds while the next batch might not fit.
        self.read_size = min(spec.batch_size, spec.max_pending)
        self.max_read_size = min(spec.max_batch_size, max(self.read_size, spec.max_pending // 4))
        self.lease_s = spec.write_lease
        self.role = STARTING
        self.epoch = 0            # this node's epoch while master
        self.known_epoch = 0      # the newest epoch this node has seen anywhere
        self.delivered = 0
        self.skipped = 0          # already processed when the master got them
        self.failed = 0
        self.rolled_back = 0      # delivered by promotion catch-up
        self.claims_unproven = 0  # claimed messages Redis did not show processed: they bake on
        self.escalations_refused = 0  # batches not from the master at its epoch (admit_escalation)
        # For the metrics (cluster/metrics.py), counted per batch or step, never per message:
        self.escalations_taken = 0  # escalation batches admitted (on_claims)
        self.read = 0             # uplink entries this node read (the warm-up row is none)
        self.fenced = 0           # writes as master the fence refused (each a step-down)
        self.left: Counter = Counter()  # stream -> messages committed master steps sent there
        self.batch_timings = BatchTimings((MASTER, WORKER))  # batch durations by role
        self.lateness = Timings(LATENESS_BUCKETS)  # how late due deadlines fired (flow clock)
        self.metrics: MetricsServer | None = None
        self.held = False         # backpressure: the reader plans no batch
        self._paced_ms: int | None = None  # the reader's pace as last set
        self.holding = False      # a master batch waits for ZooKeeper to come back
        self.handled_upto: str | None = None  # the last uplink position this node handled
        self.streaming = False
        self.streaming_since = 0.0
        self._lock = threading.Lock()   # memory only: never held across a Redis call
        self._work = threading.Lock()   # one batch or one promotion catch-up at a time
        self._stop = threading.Event()
        self._pause = pause or self._stop.wait
        self._wake = threading.Event()
        self._term_requested = threading.Event()
        self._stopped = False
        self._to_surface: list[Message] = []
        self.store: FlowStore | None = None
        self.zk = None
        self.leadership: Leadership | None = None
        self.sender: EscalationSender | None = None
        self.server = None
        self.health = NodeHealth()
        self.address = ""
        self.query = None

    # -- life cycle -------------------------------------------------------
    def start(self) -> None:
        """Connect (waiting up to the deadline), check Redis and the start position, start
        the stream's engine, serve gRPC, read; join the election once the stream is warm."""
        parts = self.parts
        if self.cfg.metrics_listen:  # first: a bad metrics address stops nothing half started
            self.metrics = start_metrics(self.cfg, lambda: [self], lambda: self.server, self.name)
        self.store = parts.store(self)
        self._check_redis()
        self.zk = parts.zookeeper(self)
        self._guard_epoch(self._zookeeper_epoch())
        self.handled_upto = self.store.handled_position()
        resuming = (self.checkpoint_dir().parent / "start.json").exists()
        start = self._start_position()
        self._check_retention(resuming)
        parts.prepare_stream(self)
        self.server, port = parts.server(self)
        self.cfg.security.warn_if_insecure(self.cfg.listen, self._stop)
        host = self.cfg.listen.rsplit(":", 1)[0]
        self.address = self.cfg.advertise or f"{host}:{port}"
        self.sender = parts.sender(self)
        with self._lock:
            self.role = WORKER
        self.leadership = parts.leadership(self)
        self.leadership.start()
        parts.start_timers(self)
        self.query = parts.stream(self, start)
        self._pace()
        self._event(logging.INFO, "started", "%s started reading %s (gRPC %s); ready after the warm-up batch",
                    self.cfg.node_id, self.keys.uplink, self.address, address=self.address)

    def _check_redis(self) -> None:
        """Refuse (or warn, per ``cluster.redis_checks``) a Redis that may evict or forget."""
        problems = self.store.config_problems()
        if not problems:
            return
        text = "; ".join(problems)
        if self.spec.redis_checks == "refuse":
            raise StartRefused(f"Redis at {redact_url(self.cfg.redis_url)} cannot keep the flow's promises: "
                               f"{text} (see README 'Redis configuration'; cluster.redis_checks: warn runs anyway)")
        log.warning("RUNNING ON A REDIS THAT CANNOT KEEP THE PROMISES: %s", text)

    def _zookeeper_epoch(self) -> int:
        stat = self.zk.exists(f"/twinflow/{self.name}/epoch")
        return stat.version if stat else 0

    def _guard_epoch(self, seen: int, deadline_s: float | None = None) -> None:
        """Raise Redis's fencing epoch to the newest this node has seen (it must never go back)."""
        in_redis = self.store.current_epoch(deadline_s=deadline_s)
        newest = max(seen, in_redis, self.known_epoch)
        if in_redis < newest:
            self._event(logging.WARNING, "redis_epoch_behind",
                        "Redis's fencing epoch is %d but epoch %d exists (Redis lost data?): raising it",
                        in_redis, newest, in_redis=in_redis, epoch=newest)
            newest = self.store.raise_epoch(newest, deadline_s=deadline_s)
        with self._lock:
            self.known_epoch = max(self.known_epoch, newest)

    def checkpoint_dir(self) -> Path:
        return Path(self.cfg.state_dir) / self.name / self.cfg.node_id / "checkpoint"

    def _check_retention(self, resuming: bool) -> None:
        """Refuse to resume reading from a position whose following entries were trimmed."""
        if not resuming:
            return  # a new checkpoint starts where _start_position chose, which exists
        kept = self.store.trimmed_before()
        read = self.store.read_position()
        if kept is None or read is None or position_order(read) >= position_order(kept):
            return
        raise StartRefused(
            f"{self.cfg.node_id} last read {self.keys.uplink} up to {read}, but the uplink was trimmed up to "
            f"{kept} while it was away (longer than uplink.retention = {self.spec.retention:.0f} s): what it "
            f"would read next is gone. Every trimmed entry was processed by the flow; start the node on a new "
            f"state directory with --start-from processed")

    def _start_position(self) -> dict:
        """Where a new checkpoint starts reading (a checkpoint with commits resumes by itself).

        Chosen once per state directory and kept beside the checkpoint, so a
        restart before the first commit starts at the same place. A node with
        a new state directory on a flow that has processed entries must be told
        where to start: after the processed mark, or from the beginning (safe,
        since nothing at or before the mark is delivered again, but slow).
        """
        checkpoint = self.checkpoint_dir()
        chosen = checkpoint.parent / "start.json"
        if chosen.exists():
            return json.loads(chosen.read_text())
        commits = checkpoint / "commits"
        if commits.is_dir() and any(commits.iterdir()):
            return {"id": "0-0", "n": 0}  # a checkpoint from before start.json existed
        mark = self.store.processed_mark()
        if mark is None or self.cfg.start_from == "beginning":
            start = {"id": "0-0", "n": 0}
        elif self.cfg.start_from == "processed":
            start = {"id": mark, "n": self.store.entries_upto(mark)}
        else:
            raise StartRefused(
                f"flow {self.name!r} has processed its uplink up to {mark}, but this node has no "
                f"checkpoint in {checkpoint}: pass --start-from processed (read after {mark}; the usual "
                f"choice for a new or rebuilt node) or --start-from beginning (re-read the whole uplink; "
                f"entries up to {mark} are never delivered again)")
        oldest = self.store.oldest_after(mark)
        if oldest is not None and time.time() - position_order(oldest)[0] / 1000 > self.spec.message.id_ttl:
            log.warning("the oldest unprocessed uplink entry (%s) is older than id_ttl (%d s): a re-published "
                        "duplicate of a message processed before it may no longer be recognised by its ID",
                        oldest, self.spec.message.id_ttl)
        chosen.parent.mkdir(parents=True, exist_ok=True)
        chosen.write_text(json.dumps(start))
        log.info("%s starts reading %s after %s", self.cfg.node_id, self.keys.uplink, start["id"])
        return start

    def run_forever(self) -> int:
        """Run until stopped; SIGTERM (see request_term) hands the master role over first."""
        return run_until_stopped(self, lambda: self.leadership.is_master)

    def request_term(self) -> None:
        """Ask for a graceful stop (safe to call from a signal handler)."""
        self._term_requested.set()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._event(logging.INFO, "stopping", "%s stopping (%s)", self.cfg.node_id, self.role, role=self.role)
        self._stop.set()
        self._wake.set()
        self.health.stopping()
        if self.store is not None:
            # A batch waiting for Redis raises now and is not committed.
            self.store.close()
        if self.query is not None:
            try:
                self.parts.stop_stream(self.query)
            except Exception:  # a batch refused on purpose (NodeStopping) fails the query
                log.info("uplink stream stopped with its last batch uncommitted (read again on restart)")
        try:
            self._settle_ahead(timeout_s=max(5.0, 2 * self.lease_s))
        except Exception:  # logged by the batch thread; handled_id covers the batch
            pass
        if self.leadership is not None:
            self.leadership.stop()
        if self.sender is not None:
            self.sender.stop()
        if self.server is not None:
            self.server.stop(1.0)
        if self.metrics is not None:
            self.metrics.stop()
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        self.parts.close()

    # -- batches from the uplink ------------------------------------------
    def on_batch(self, batch_id: int, rows: list[tuple[str, bytes | None, int | None]]) -> None:
        """Process one batch whole, or raise so that Spark does not commit it; a master's batch
        may run ahead instead (module doc, "Batches run ahead")."""
        self._settle_ahead()
        handed = False
        self._work.acquire()
        try:
            last = last_position(rows)
            if self._may_run_ahead(last):
                self._ahead = self.ahead.submit(self._run_ahead, batch_id, rows, last)
                handed = True  # the batch thread releases _work
                return
            msgs, bad = self._decode(rows)
            self._take_batch(batch_id, msgs, bad, last)
        finally:
            if not handed:
                self._work.release()

    def _may_run_ahead(self, last: str | None) -> bool:
        """Whether this batch may run after on_batch returned (caller holds _work): as master,
        once handled_id in Redis covers it; else it runs here, as before."""
        if self.ahead is None or last is None or self._stop.is_set():
            return False
        with self._lock:
            if self.role != MASTER:
                return False
        try:
            self.store.record_handled(last, deadline_s=self.lease_s)
        except RedisUnavailable:
            return False
        return True

    def _run_ahead(self, batch_id: int, rows: list[tuple], last: str) -> None:
        """The batch thread: the batch as on_batch would have run it (decoding too: Spark's
        thread goes back to Spark sooner), then _work released."""
        try:
            msgs, bad = self._decode(rows)
            self._take_batch(batch_id, msgs, bad, last)
        except NodeStopping as exc:  # handled_id covers it: a promoted node delivers it
            log.info("%s: %s", self.cfg.node_id, exc)
        except BaseException as exc:
            self.batch_error = exc
            self._event(logging.ERROR, "batch_failed", "%s: batch %d failed after Spark committed it; stopping",
                        self.cfg.node_id, batch_id, batch=batch_id, exc_info=True)
            raise
        finally:
            self._work.release()

    def _settle_ahead(self, timeout_s: float | None = None) -> None:
        """Wait for the batch running ahead; raise what it raised."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.result(timeout_s)

    def _take_batch(self, batch_id: int, msgs: list[Message], bad: list[tuple], last: str | None) -> None:
        """Record the bad entries, then bake or run the batch (caller holds _work)."""
        if self._stop.is_set():
            raise NodeStopping(f"batch {batch_id} arrived while stopping; it is read again on restart")
        started, role = time.perf_counter(), self.role  # wall time, also under a simulator's clock
        with self._lock:
            self.read += len(msgs) + len(bad)
        if bad:
            record_bad(self.store, self.spec, bad)
            with self._lock:
                self.failed += len(bad)
        if last is None:
            return
        try:
            self._process(batch_id, msgs, last)
        finally:
            self.holding = False
            self.batch_timings.observe(role, time.perf_counter() - started)

    # -- batches run on an executor (a sharded flow, see sharded_node) ------
    def executor_role(self) -> tuple[str, int]:
        """What an executor may do with this shard's next batch (caller holds _work): run it as
        master at the epoch, bake-check it as worker, or hand it back ("driver": starting, or a
        master whose ZooKeeper connection is suspended, which must hold it here)."""
        with self._lock:
            role, epoch = self.role, self.epoch
        if role == MASTER and self.leadership.may_write():
            return MASTER, epoch
        return (WORKER, 0) if role == WORKER else ("driver", 0)

    def take_result(self, batch_id: int, r: "ShardResult") -> None:
        """Finish a batch an executor ran for this shard (caller holds _work): count it, send
        its claims, step down if its writes were refused, bake what it could not commit."""
        if r.warm:
            self._warmed()
        self.task_pid = r.pid
        self.state_loads += r.state_loads
        if self._stop.is_set():
            raise NodeStopping(f"batch {batch_id} finished while stopping; it is read again on restart")
        with self._lock:
            self.failed += r.failed
            self.delivered += r.delivered
            self.skipped += r.skipped
            # Handed back to the driver, the good rows are counted by _take_batch here.
            self.read += r.read if r.role in (MASTER, WORKER) else r.failed
        self.left.update(r.left)
        if r.last is None:
            return
        if r.role == WORKER:
            self._offer(r.msgs, r.done, r.last)
            return
        if r.role != MASTER:  # bad entries: recorded by the executor already
            self._take_batch(batch_id, self._decode(r.rows)[0], [], r.last)
            return
        self.flow = None  # the executor committed: a flow here is behind Redis
        self.remote_deadline = r.next_deadline
        self.remote_batch_at = self.monotonic()
        if r.claims and self.spec.pair is not None:
            self.sender.send(r.claims)
        if r.fenced_by:
            self.refused(Fenced(r.epoch, r.fenced_by))
        elif r.unreachable:
            self._lost_redis(r.unreachable)
        if r.msgs:  # not committed: a worker's now
            self._bake(r.msgs, r.last)
        else:
            self._handled(r.last)
        self._wake.set()

    def _process(self, batch_id: int, msgs: list[Message], last: str) -> None:
        while True:
            if self._stop.is_set():
                raise NodeStopping(f"batch {batch_id} held while stopping; it is read again on restart")
            with self._lock:
                role, epoch = self.role, self.epoch
            if role != MASTER:
                self._bake(msgs, last)
                return
            if self.leadership.may_write():
                rest = self._run_master(msgs, epoch, last)
                if rest is None:
                    self._handled(last)
                else:  # stepped down part-way: the rest is a worker's
                    self._bake(rest, last)
                return
            # Master but ZooKeeper is suspended: hold the batch until the
            # connection is back (keep the role) or the session is lost (bake).
            self.holding = True
            self._pause(0.05)

    def _decode(self, rows) -> tuple[list[Message], list[tuple]]:
        """Messages, and (position, reason, body, size) of the entries that are bad."""
        msgs, bad, warm = decode_rows(rows, self.spec.message)
        if warm:
            self._warmed()
        return msgs, bad

    def _warmed(self) -> None:
        """The query's first batch has run: from now on it reads at speed."""
        if not self.streaming:
            self.streaming_since = time.time()
            self.streaming = True
            self.health.streaming(True)
            self._event(logging.INFO, "streaming", "%s is streaming", self.cfg.node_id)

    def _handled(self, position: str) -> None:
        with self._lock:
            if self.handled_upto is None or position_order(position) > position_order(self.handled_upto):
                self.handled_upto = position

    def _bake(self, msgs: list[Message], last: str) -> None:
        """Bake as worker (caller holds _work); records how far this node handled the uplink."""
        self._offer(*processed_as_worker(self.store, msgs, last), last)

    def _offer(self, msgs: list[Message], done: list[bool], last: str) -> None:
        now = self.clock.now()
        with self._lock:
            for m, d in zip(msgs, done):
                self.sort.offer(m, now, processed=d)
        self._handled(last)
        self._update_backpressure()
        self._wake.set()

    def master_flow(self) -> MasterFlow:
        """The master's flow graph; loaded from Redis after a promotion or a failed step."""
        if self.flow is None:
            self.flow = MasterFlow.load(self.graph, self.store, deadline_s=self.lease_s)
            self.flow.left = self.left
            self.open_in_flow = self.flow.pending()
        return self.flow

    def _run_master(self, msgs: list[Message], epoch: int, last: str) -> list[Message] | None:
        """Run a batch through the flow as master at ``epoch`` (caller holds _work); None when
        all of it was committed, else the uncommitted rest, after this node stopped being master.
        The steps and their guesses: ``master_steps``."""
        rest = run_master_batch(self, msgs, epoch, last, self.flow, self.clock.now)
        self._note_open()
        if rest is None:
            self._wake.set()  # the step may have opened an earlier deadline
        return rest

    # -- master_steps.MasterSide ------------------------------------------
    def still_master(self, epoch: int) -> bool:
        with self._lock:
            return self.role == MASTER and self.epoch == epoch

    def processed(self, msgs: list[Message]) -> list[bool]:
        return self.store.processed(msgs, deadline_s=self.lease_s)

    def refused(self, exc: Fenced | RedisUnavailable) -> None:
        """A write of this master (here or on an executor) was refused or never got through."""
        if not isinstance(exc, Fenced):
            self._lost_redis(str(exc))
            return
        self._event(logging.ERROR, "fenced", "%s: %s; stepping down", self.cfg.node_id, exc,
                    epoch=exc.epoch, newest=exc.newest)
        with self._lock:
            self.known_epoch = max(self.known_epoch, exc.newest)
            self.fenced += 1
        self._step_down("fenced")

    def _lost_redis(self, why: str) -> None:
        self._event(logging.ERROR, "lease_expired", "%s: %s; over the write lease (%.1f s): stepping down",
                    self.cfg.node_id, why, self.lease_s, reason=why, lease=self.lease_s)
        self._step_down("Redis unreachable")

    def drop(self) -> None:
        self.flow = None

    def committed_chunk(self, chunk: list[Message], fresh: list[Message]) -> None:
        with self._lock:
            self.delivered += len(fresh)
            self.skipped += len(chunk) - len(fresh)
        self.driver_steps += 1
        if self.spec.pair is not None and chunk:
            self.sender.send([(m.id, str(m.key), m.position) for m in chunk])

    def commit(self, epoch: int, make_step, guess: bool = False) -> bool:
        """Build one step on the master's flow and commit it (a timer's firing); False after
        stepping down. Any failure drops the flow: its nodes are ahead of Redis, and the next
        step starts from the state Redis holds (``master_steps.commit_one``)."""
        if not commit_one(self, epoch, make_step, guess):
            return False
        self.driver_steps += 1
        self._note_open()
        return True

    def _note_open(self) -> None:
        """Count what the flow holds open, for status (caller holds _work: status itself never
        reads the flow, which a batch may be building a step on)."""
        flow = self.flow
        if flow is not None:
            self.open_in_flow = flow.pending()

    def _step_down(self, reason: str) -> None:
        with self._lock:
            self.role = WORKER
        self.flow = None
        self.leadership.step_down(reason)

    # -- escalations from the master --------------------------------------
    def admit_escalation(self, from_node: str, epoch: int) -> str | None:
        """Why a batch from ``from_node`` at ``epoch`` is refused, or None to take it: only the
        node ZooKeeper names as master (the epoch znode's writer), at that master's epoch."""
        why = None
        if self.leadership is None:
            why = "this node has not joined the flow yet"
        elif epoch < self.known_epoch:
            why = f"stale epoch {epoch}: epoch {self.known_epoch} exists"
        else:
            master, master_epoch = self.leadership.current_master()
            if epoch > master_epoch:  # promoted since our watch last fired? ask ZooKeeper itself
                master, master_epoch = self.leadership.current_master(fresh=True)
            if epoch != master_epoch:
                why = f"epoch {epoch} is not the master's ({master_epoch})"
            elif from_node != master:
                why = f"{from_node!r} is not the master ({master!r} is, at epoch {master_epoch})"
        if why is not None:
            with self._lock:
                self.escalations_refused += 1
            self._event(logging.WARNING, "escalation_refused", "refused an escalation batch of %s from %s: %s",
                        self.name, from_node, why, from_node=from_node, from_epoch=epoch, reason=why)
        return why

    def on_claims(self, epoch: int, claims: list[tuple[str, str, str]]) -> int:
        """Release the baked messages an escalation claims, once Redis proves them processed
        (ID cache or processed mark, one round trip): a claim is a hint, the ID cache the
        record, so no escalation, forged or buggy, releases a message nobody processed.
        Returns how many were released."""
        if epoch < self.known_epoch:
            raise StaleEpoch(f"epoch {epoch} is older than {self.known_epoch}")
        parse = self.spec.message.parse_key
        with self._lock:
            self.escalations_taken += 1
            self.known_epoch = max(self.known_epoch, epoch)
            if self.role == MASTER:
                return 0  # a newer master is us: nothing of ours is baked
            taken = self.sort.take_claims([(mid, parse(key), pos) for mid, key, pos in claims])
        proven = [False] * len(taken)
        try:
            if taken:
                proven = self.store.processed(self.sort.claimed_messages(taken), deadline_s=self.lease_s)
        finally:  # also when Redis failed: what was not proven bakes on
            with self._lock:
                released = len(self.sort.settle_claims(taken, proven))
                self.claims_unproven += proven.count(False)
        self._update_backpressure()
        return released

    def escalation_targets(self) -> dict[str, str]:
        """The other members' gRPC addresses; raises MembersUnknown while ZooKeeper cannot
        say (the sender then keeps its targets and their buffered claims)."""
        members = self.leadership.members() if self.leadership else {}
        members.pop(self.cfg.node_id, None)
        return members

    # -- roles ------------------------------------------------------------
    def may_contend(self) -> bool:
        """Queue for the election only once the stream is warm and Redis answers."""
        return self.streaming and not self._stop.is_set() and self.store.ping()

    def on_promoted(self, epoch: int) -> None:
        """Take the master role: fence, then deliver what the old master left (see module doc).

        Raises when that fails; the election demotes the node and queues it again.
        """
        if not self._work.acquire(timeout=max(5.0, 5 * self.lease_s)):
            raise RuntimeError("a batch in flight did not finish (waiting for Redis?); not taking the role")
        try:
            # Confirmed by WAIT with cluster.wait_replicas (as a COMMIT is): else this raises and
            # the election demotes the node and queues it again (issue 18, item 6).
            in_force = self.store.raise_epoch(epoch, deadline_s=self.lease_s, replicas=self.spec.wait_replicas,
                                              replica_wait_ms=self.spec.replica_wait_ms)
            if in_force > epoch:
                # Redis has seen a newer epoch than ZooKeeper just gave us (ZooKeeper
                # was reset?): our writes would all be refused. Stay a worker.
                self._event(logging.ERROR, "promotion_refused",
                            "epoch %d from ZooKeeper is older than %d in Redis; not taking the master role",
                            epoch, in_force, epoch=epoch, newest=in_force)
                self.leadership.step_down("stale epoch")
                return
            self.flow = None
            self.master_flow()  # the state the old master committed
            self.remote_deadline = None
            with self._lock:
                self.epoch = epoch
                self.known_epoch = max(self.known_epoch, epoch)
                self.role = MASTER
            self._pace()
            rolled = self._catch_up(epoch)
            with self._lock:
                self.sort.rollback()  # every baked message was in the range just delivered
                self.rolled_back += rolled
            self._update_backpressure()
        except BaseException:
            with self._lock:
                self.role = WORKER
            self.flow = None
            raise
        finally:
            self._work.release()
        self._event(logging.INFO, "promoted", "%s is master at epoch %d; delivered %d messages the old master had not",
                    self.cfg.node_id, epoch, rolled, epoch=epoch, rolled_back=rolled)
        if rolled:  # its own line, so that rollbacks can be counted and alerted on by name
            self._event(logging.WARNING, "rolled_back", "%s rolled back %d messages at epoch %d",
                        self.cfg.node_id, rolled, epoch, epoch=epoch, count=rolled)

    def _catch_up(self, epoch: int) -> int:
        """Deliver every uplink entry after the processed mark up to where this node has
        handled the uplink, re-read from Redis; returns how many were delivered now."""
        mark = self.store.processed_mark(deadline_s=self.lease_s)
        upto = self.handled_upto
        if upto is None or (mark is not None and position_order(upto) <= position_order(mark)):
            return 0
        before = self.delivered
        after = mark
        while True:
            rows = self.store.read_uplink(after, upto, self.max_read_size, self.spec.message.max_bytes,
                                          max_bytes=self.spec.batch_bytes, deadline_s=self.lease_s)
            if not rows:
                break
            msgs, bad = self._decode(rows)
            record_bad(self.store, self.spec, bad, deadline_s=self.lease_s)
            after = rows[-1][0]
            if self._run_master(msgs, epoch, after) is not None:
                raise _StepDown(f"stopped being master at epoch {epoch} during catch-up")
            if after == upto:
                break
        return self.delivered - before

    def on_demoted(self, reason: str) -> None:
        with self._lock:
            self.role = WORKER
        self.flow = None
        # The epoch of the term that ended: the election's, also when on_promoted failed before taking it.
        epoch = getattr(self.leadership, "epoch", 0) or self.epoch
        routine = reason in ("handover", "stopping")
        self._event(logging.INFO if routine else logging.WARNING, "demoted", "%s demoted (%s), epoch %d",
                    self.cfg.node_id, reason, epoch, epoch=epoch, reason=reason)

    def handover(self, timeout_s: float) -> dict:
        if self.leadership is None:
            return {"ok": False, "reason": "node is not running"}
        return self.leadership.handover(timeout_s)

    def _pace(self) -> None:
        """A worker's reader plans at most every ``worker_pace_ms``: its batches only bake, and
        fewer, larger ones leave the cores to the master. A master reads as fast as it can."""
        want = 0 if self.role == MASTER else self.cfg.worker_pace_ms
        if want != self._paced_ms and self.query is not None:
            self.parts.pace(self.query, want)
            self._paced_ms = want

    # -- backpressure -----------------------------------------------------
    def _update_backpressure(self) -> None:
        """Hold the reader while the next batch might take the bake past max_pending."""
        with self._lock:
            want = self.role != MASTER and self.sort.pending + self.max_read_size > self.spec.max_pending
            if want == self.held:
                return
            self.held = want
            pending = self.sort.pending
        if self.query is not None:
            self.parts.hold(self.query, want)
        if want:
            self._event(logging.WARNING, "backpressure_on",
                        "%s holds %d messages (max_pending %d): stopped reading until claims free room",
                        self.cfg.node_id, pending, self.spec.max_pending, pending=pending,
                        max_pending=self.spec.max_pending)
        else:
            self._event(logging.INFO, "backpressure_off", "%s reads again (%d messages held)",
                        self.cfg.node_id, pending, pending=pending)

    # -- timers -----------------------------------------------------------
    def run_timers(self) -> None:
        """The timer thread: a round (see ``timer_round``), then wait for the next one or a wake-up."""
        while not self._stop.is_set():
            wait = self.timer_round()
            if wait is None:
                return
            self._wake.wait(wait)
            self._wake.clear()

    def timer_round(self) -> float | None:
        """Fire what is due now: bake expiry (worker), the flow's deadlines (master), the
        sweep, the status and epoch guard, the lease check. Returns the seconds until the
        next round is due, or None once the node stops. Never raises: a timer must keep firing."""
        # Often enough that a healthy master's status writes keep its lease fresh.
        status_every = min(self.cfg.status_interval_s, self.lease_s / 3)
        now = self.clock.now()
        with self._lock:
            if self.role != MASTER:
                self._to_surface.extend(self.sort.tick(now))
            deadline = self.sort.next_deadline()
            surface, self._to_surface = self._to_surface, []
        try:
            master_deadline = self._fire_due(now)
            if master_deadline is not None and (deadline is None or master_deadline < deadline):
                deadline = master_deadline
            if surface:
                log.warning("%d messages fully baked without a claim (first: %s)", len(surface), surface[0].id)
                try:
                    self.store.surface_unclaimed(surface, self.spec.pair.unclaimed_outlink)
                except Exception:
                    with self._lock:  # surfaced on the next round instead; they are still held
                        self._to_surface[:0] = surface
                    raise
            mono = self.monotonic()
            if mono >= self._next_sweep:
                self._next_sweep = mono + self.cfg.sweep_interval_s
                self._sweep()
            if mono >= self._next_trim and self.role == MASTER:
                self._next_trim = mono + self.cfg.trim_interval_s
                self._trim()
            if mono >= self._next_status:
                self._next_status = mono + status_every
                self._guard_epoch(0, deadline_s=0)
                self.store.write_status(self.status(), ttl_s=max(5, int(4 * self.cfg.status_interval_s)))
        except Exception as exc:
            if self._stop.is_set():
                return None
            log.warning("timer loop: %s: %s", type(exc).__name__, exc)
        self._pace()
        self._check_lease()
        wait = min(status_every, self.cfg.sweep_interval_s)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - self.clock.now()))
        return wait

    def _fire_due(self, now: float) -> float | None:
        """As master, fire the flow's deadlines due at ``now`` and commit what they did;
        returns the next deadline. A batch in progress fires them itself, so this never waits
        for one; and the flow is only read holding the node (``_work``), never while a batch
        builds a step on it or drops it."""
        if self.role != MASTER:
            return None
        if not self._work.acquire(blocking=False):
            # A batch holds the node and fires them itself (an executor's, before its batch);
            # look again shortly rather than spin on a deadline already past.
            return now + BUSY_RETRY_S
        try:
            flow = self.flow
            due = flow.next_deadline() if flow is not None else self.remote_deadline
            if due is None or due > now:
                return due
            if flow is None:
                # Executors run this shard's batches and fire what is due first, on a flow they
                # keep; firing here would load the whole state. Only when no batch came lately.
                quiet = self.monotonic() - self.remote_batch_at
                if quiet < REMOTE_FIRE_AFTER_S:
                    return now + REMOTE_FIRE_AFTER_S - quiet
            with self._lock:
                role, epoch = self.role, self.epoch
            if role == MASTER and self.leadership.may_write():  # a flow dropped is loaded again
                self.lateness.observe(max(0.0, now - due))  # once per firing round: the earliest due
                self.commit(epoch, lambda flow: flow.fire(now, epoch))
            flow = self.flow
            return flow.next_deadline() if flow is not None else None
        finally:
            self._work.release()

    def _check_lease(self) -> None:
        """A master that has not reached Redis for longer than its lease steps down."""
        if self.leadership is None or not self.leadership.is_master or self.store.silent_s() <= self.lease_s:
            return
        # A starved timer thread also looks silent: ask Redis once more first.
        if self.store.ping():
            return
        silent = self.store.silent_s()
        if silent > self.lease_s:
            self._event(logging.ERROR, "lease_expired",
                        "%s: no answer from Redis for %.1f s, over the write lease (%.1f s): stepping down",
                        self.cfg.node_id, silent, self.lease_s, seconds=round(silent, 3), lease=self.lease_s)
            self._step_down("Redis unreachable")

    def _sweep(self) -> None:
        """Release every held message at or before the processed mark (one Redis read)."""
        mark = self.store.processed_mark(deadline_s=0)
        if mark is None:
            return
        with self._lock:
            released = self.sort.release_upto(mark)
        if released:
            self._update_backpressure()

    def _trim(self) -> None:
        """As master, drop the uplink entries every live node has read and the flow processed,
        once older than ``uplink.retention`` (one script; the live nodes are ZooKeeper's members).
        When ZooKeeper cannot list them, nothing is trimmed: a live worker's read position
        must never be left out."""
        try:
            live = set(self.leadership.members()) | {self.cfg.node_id}
        except MembersUnknown as exc:
            log.info("%s trims nothing this round: %s", self.cfg.node_id, exc)
            return
        n, kept = self.store.trim_uplink(live, self.spec.retention, self.clock.now())
        if n:
            log.info("%s trimmed %d uplink entries before %s", self.cfg.node_id, n, kept)

    def _event(self, level: int, name: str, msg: str, *args, **fields) -> None:
        """Log the operator event ``name`` (``twinflow.logs``) with this node's flow, ID and epoch (its
        own as master, else the newest it has seen, left out while none is: epochs start at 1;
        ``epoch=`` overrides it). Reads without the lock, so it may be called holding it."""
        fields.setdefault("epoch", (self.epoch if self.role == MASTER else self.known_epoch) or None)
        event(log, level, name, msg, *args, flow=self.name, node=self.cfg.node_id, **fields)

    def status(self) -> dict:
        with self._lock:
            out = {
                "flow": self.name,
                "node_id": self.cfg.node_id,
                "role": self.role,
                "epoch": self.epoch if self.role == MASTER else self.known_epoch,
                "pending": self.open_in_flow if self.flow is not None else 0,
                "baked": self.sort.pending,
                "claimed": self.sort.claimed,
                "rolled_back": self.rolled_back,
                "claims_unproven": self.claims_unproven,
                "escalations_refused": self.escalations_refused,
                "delivered": self.delivered,
                "failed": self.failed,
                "unclaimed": self.sort.unclaimed,
                "backpressure": int(self.held),
                "holding": int(self.holding),
                "grpc_address": self.address,
            }
        out["zookeeper"] = "suspended" if self.leadership and self.leadership.suspended else "connected"
        out["redis"] = self.store.health() if self.store else "ok"
        out["streaming"] = int(self.streaming)
        out["streaming_since"] = self.streaming_since
        out["pid"] = os.getpid()
        if self.task_pid:
            out["task_pid"] = self.task_pid
            out["state_loads"] = self.state_loads
        try:
            out["uplink_lag"] = self.store.uplink_lag(self.cfg.node_id) if self.store else 0
        except Exception:  # status must answer even when Redis does not
            out["uplink_lag"] = -1
        return out
