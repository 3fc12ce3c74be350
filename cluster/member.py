"""A member: a peer's part in one flow (or one shard), master or worker, and the switch between them.

The peer (``peer.py``, one ``twinflow run`` process) holds the process's
ZooKeeper session, gRPC server, engine and uplink reading; the member holds
the flow's side of the pair: its role and epoch, its store, its election,
its bake and claims, its backpressure and timers. Every member reads the
whole uplink of its flow. What it does with a batch depends on its role:

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

It is made of parts that each own their state and are handed the member,
whose shared pieces they read (its store, election, clock, ``batch_lock``):

- ``member_state``: role and epoch (changed there only), handled position, counts;
- ``batch_intake``: batches processed whole or not committed, run ahead (promise 1);
- ``master_side``: the master's term, what it does with a session's outcome, stepping down (3);
- ``promotion``: fence, catch up, roll back on promotion (1, 2);
- ``claims``: the worker's bake; escalations admitted only from the master; claims proven (1, 3);
- ``backpressure``: a worker never drops, it stops reading (5);
- ``member_timers``: deadlines, bake expiry, sweep, trim, status, lease (1, 3, 4);
- ``member_events``: records of role changes and failovers, queued in memory, written by the timers;
- ``start_position``: where a member starts reading, and what it refuses.

A batch goes one way: the uplink reading calls :meth:`FlowMember.on_batch`, the
intake runs it as master (``master_side``, whose session commits it in Redis and
returns an outcome) or bakes it as worker (``claims``); nothing calls back up.

The memory lock (``state.lock``) guards memory only and is never held across a
Redis call, so handover and status answer while Redis hangs; ``batch_lock``
admits one batch or one promotion catch-up at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import logging
import os
import threading
import time

from .. import __version__
from ..logs import event
from ..runtime.clock import Clock, SystemClock
from ..runtime.flowgraph import FlowGraph
from ..runtime.nodes.sort import ClaimSortNode
from ..runtime.store.flow_store import FlowStore
from .reader_control import ReaderControl
from .batch_intake import BatchIntake
from .claims import Claims, NoPair
from .escalation import EscalationSender
from .leadership import Leadership
from .master_flow import logged_nodes
from .master_side import MasterSide
from .member_events import MemberEvents
from .member_state import MemberState
from .member_timers import MemberTimers
from .audit_upkeep import AuditUpkeep
from .stream_upkeep import StreamUpkeep
from .on_cluster import cluster_flow, flow_keys
from .collaborators import MemberParts
from .peer_config import PeerConfig
from .promotion import Promotion
from .roles import WORKER
from .start_position import check_redis, check_retention, checkpoint_dir, start_position
from .warm_state import WarmState
from .zk_paths import ZkPaths

if TYPE_CHECKING:
    from .escalation_servicer import Claim

log = logging.getLogger("twinflow.peer")

STOP_FLUSH_WAIT_S = 1.0  # how long a stopping member waits for a timer round's flush of the events stream


class FlowMember:
    """A peer's part in one flow (or one shard of it): one side of an active-active pair (see the module doc)."""

    def __init__(self, graph: FlowGraph, config: PeerConfig, *, parts: MemberParts, clock: Clock | None = None,
                 monotonic=time.monotonic, pause=None, batch_lock=None):
        """``parts`` builds the member's collaborators (``real_parts.RealParts`` for real servers);
        ``clock`` gives the flow's time, ``monotonic`` the timers' local intervals, ``pause(s)``
        the wait of a held batch (default: until stopped) and ``batch_lock`` the lock a batch and
        a promotion take turns on (default: a ``threading.Lock``); a simulator passes its virtual
        clock, and a lock whose waits are virtual time."""
        spec = cluster_flow(graph)
        self.parts = parts
        self.graph = graph
        self.spec = spec
        self.name = graph.name
        self.cfg = config
        self.keys = flow_keys(graph)
        self.clock = clock or SystemClock()
        self.monotonic = monotonic
        self.lease_s = spec.write_lease
        self.batch_lock = batch_lock or threading.Lock()  # one batch or one promotion catch-up at a time
        self.stopping = threading.Event()
        self.wake = threading.Event()  # the timers look again now
        self.pause = pause or self.stopping.wait
        self._stopped = False
        # The servers, connected as the peer starts (open_store, prepare, serve).
        self.store: FlowStore | None = None
        self.warm: WarmState | None = None  # a worker's warm copy of the history (warm_state.py)
        self.zk = None
        self.leadership: Leadership | None = None
        self.sender: EscalationSender | None = None
        self.health = None        # the peer's, shared by its members (prepare)
        self.address = ""
        # The parts (module doc), each owning its state.
        pair = spec.pair
        self.state = MemberState()
        self.events = MemberEvents(self)  # first: any part may log an event a timeline shows
        self.claims = Claims(self, ClaimSortNode(pair.rules.bake_times(), pair.unclaimed_outlink, pair.max_pending)
                             if pair else NoPair())
        self.master = MasterSide(self, parts.writes())
        self.intake = BatchIntake(self, parts.batches_ahead())
        self.reader = ReaderControl(self)
        self.promotion = Promotion(self)
        self.timers = MemberTimers(self)
        self.audit = AuditUpkeep(self)
        self.streams = StreamUpkeep(self)

    # -- life cycle (driven by the peer, peer.py) ----------------------------
    def open_store(self) -> None:
        """Connect to Redis (waiting up to the deadline) and check that it can keep the promises."""
        self.store = self.parts.store(self)
        check_redis(self)
        if logged_nodes(self.graph):
            self.warm = WarmState(self.graph, self.store, monotonic=self.monotonic)

    def prepare(self, peer) -> dict:
        """Check the fencing epoch against the peer's ZooKeeper, choose where to start reading
        (StartRefused when that could break a promise); returns the start position."""
        self.health = peer.health
        self.zk = peer.zk
        self.guard_epoch(self._zookeeper_epoch())
        self.state.handled(self.store.handled_position())
        resuming = (self.checkpoint_dir().parent / "start.json").exists()
        start = start_position(self)
        check_retention(self, resuming)
        return start

    def serve(self, peer) -> None:
        """Escalate from, and take part in the election at, the peer's gRPC address; start the timers."""
        self.address = peer.address
        self.sender = self.parts.sender(self)
        self.state.become(WORKER)
        self.leadership = self.parts.leadership(self)
        self.leadership.start()
        self.parts.start_timers(self)

    def read_with(self, reading) -> None:
        """The peer's reading now runs: this member holds and paces it from here on."""
        self.reader.attach(reading)
        self.event(logging.INFO, "started", "%s started reading %s (gRPC %s); ready after the warm-up batch",
                   self.cfg.peer_id, self.keys.uplink, self.address, address=self.address)

    def checkpoint_dir(self):
        """Where this member's reading keeps its checkpoint."""
        return checkpoint_dir(self)

    def _zookeeper_epoch(self) -> int:
        stat = self.zk.exists(ZkPaths(self.name).epoch)
        return stat.version if stat else 0

    def guard_epoch(self, seen: int, deadline_s: float | None = None) -> None:
        """Raise Redis's fencing epoch to the newest this member has seen (it must never go back)."""
        in_redis = self.store.current_epoch(deadline_s=deadline_s)
        newest = max(seen, in_redis, self.state.known_epoch)
        if in_redis < newest:
            self.event(logging.WARNING, "redis_epoch_behind",
                       "Redis's fencing epoch is %d but epoch %d exists (Redis lost data?): raising it",
                       in_redis, newest, in_redis=in_redis, epoch=newest)
            newest = self.store.raise_epoch(newest, deadline_s=deadline_s)
        self.state.saw_epoch(newest)

    def stop_member(self) -> None:
        """Stop taking batches: a batch waiting for Redis raises now and is not committed."""
        if self._stopped:
            return
        self._stopped = True
        self.event(logging.INFO, "stopping", "%s stopping (%s)", self.cfg.peer_id, self.role, role=self.role)
        self.stopping.set()
        self.wake.set()
        if self.store is not None:
            # What is queued, "stopping" too: one attempt, after a timer round's under way (whose
            # records may not include the last ones); it never raises.
            self.events.flush(wait_s=STOP_FLUSH_WAIT_S)
            try:
                self.store.drop_status()  # the timer writes none once stopping is set
            except Exception:  # Redis down: the status lapses by its TTL
                pass
            self.store.close()

    def settle(self) -> None:
        """Once the reading stopped: let a batch running ahead end, leave the election, stop sending."""
        try:
            self.intake.settle_ahead(timeout_s=max(5.0, 2 * self.lease_s))
        except Exception:  # logged by the batch thread; handled_id covers the batch
            pass
        self.intake.batch_log.close()  # no batch runs any more
        if self.leadership is not None:
            self.leadership.stop()
        if self.sender is not None:
            self.sender.stop()

    def event(self, level: int, name: str, msg: str, *args, **fields) -> None:
        """Log the operator event ``name`` (``twinflow.logs``) with this member's flow, peer ID and epoch (its
        own as master, else the newest it has seen, left out while none is: epochs start at 1;
        ``epoch=`` overrides it), and queue its record for the events stream when a timeline shows
        it (``member_events.py``). Reads without the lock and calls no server, so it may be called
        holding it."""
        fields.setdefault("epoch", self.state.shown_epoch() or None)
        event(log, level, name, msg, *args, flow=self.name, peer=self.cfg.peer_id, **fields)
        self.events.note(name, fields)

    # -- what the peer, the reading, the election and the gRPC servicers call --------
    def on_batch(self, batch_id: int, rows: list[tuple[str, bytes | None, int | None]]) -> None:
        self.intake.on_batch(batch_id, rows)

    def executor_role(self) -> tuple[str, int]:
        return self.intake.executor_role()

    def take_result(self, batch_id: int, result) -> None:
        self.intake.take_result(batch_id, result)

    def warmed(self) -> None:
        self.intake.warmed()

    def may_contend(self) -> bool:
        return self.promotion.may_contend()

    def on_promoted(self, epoch: int) -> None:
        self.promotion.on_promoted(epoch)

    def on_demoted(self, reason: str) -> None:
        self.promotion.on_demoted(reason)

    def handover(self, timeout_s: float, by: str = "admin") -> dict:
        """Hand the master role over (``Leadership.handover``); ``by``: who asked (``admin``: a
        Handover call, ``SIGTERM``), for the ``handover`` record of the events stream."""
        if self.leadership is None:
            return {"ok": False, "reason": "member is not running"}
        epoch = self.state.shown_epoch() or None  # the term handed over, before the new master's is seen
        result = self.leadership.handover(timeout_s)
        self.events.note("handover", {"epoch": epoch, "by": by, **result})
        return result

    def admit_escalation(self, from_node: str, epoch: int) -> str | None:
        return self.claims.admit_escalation(from_node, epoch)

    def on_claims(self, epoch: int, claims: list[Claim]) -> int:
        return self.claims.on_claims(epoch, claims)

    def escalation_targets(self) -> dict[str, str]:
        return self.claims.escalation_targets()

    def run_timers(self) -> None:
        self.timers.run()

    def timer_round(self) -> float | None:
        return self.timers.round()

    # -- what it reports ---------------------------------------------------------
    # What the peer, its reading and the simulator read of the parts.
    role = property(lambda self: self.state.role, doc="master, worker or starting (roles.py)")
    epoch = property(lambda self: self.state.epoch, doc="this member's epoch while master")
    streaming = property(lambda self: self.state.streaming, doc="the reading's first batch has run")
    session = property(lambda self: self.master.session, doc="the master's term (None: not master)")
    batch_error = property(lambda self: self.intake.batch_error, doc="why a batch that ran ahead failed")
    driver_steps = property(lambda self: self.master.driver_steps, doc="steps committed on this driver")
    read_size = property(lambda self: self.intake.read_size, doc="entries a batch reads under light load")
    max_read_size = property(lambda self: self.intake.max_read_size, doc="entries a batch reads at most")

    def status(self) -> dict:
        state, sort = self.state, self.claims.sort
        with state.lock:
            counts = state.counts()
            running = self.master.flow is not None  # a master's nodes: held only while it runs them
            out = {
                "flow": self.name,
                "peer_id": self.cfg.peer_id,
                "role": state.role,
                "epoch": state.shown_epoch(),
                "pending": self.master.open_in_flow if running else 0,
                "baked": sort.pending,
                "claimed": sort.claimed,
                "rolled_back": counts["rolled_back"],
                "claims_unproven": counts["claims_unproven"],
                "escalations_refused": counts["escalations_refused"],
                "escalations_taken": counts["escalations_taken"],
                "delivered": counts["delivered"],
                "failed": counts["failed"],
                "unclaimed": sort.unclaimed,
                "nohit": sort.nohit,
                "rule_pending": sort.rule_pending(),  # RULE_PEND: held per ruleset of the claim pair
                "backpressure": int(self.reader.pressure),
                "suspended": dict(self.reader.suspended),
                "holding": int(self.intake.holding),
                "grpc_address": self.address,
            }
            # Per node, as the last master step left each (master_side.note_open), and the claim
            # pair's sort, which the worker runs: read here as rule_pending is.
            pending_nodes = dict(self.master.pending_nodes) if running else {}
            if self.spec.pair is not None:
                pending_nodes[self.spec.pair.sort] = {"kind": "sort", **sort.pending_counts()}
            out["pending_nodes"] = pending_nodes
            out["links"] = {f"{node}.{outlink}": n for (node, outlink), n in self.master.links.items()
                            } if running else {}  # inside the flow, this term
        out["zookeeper"] = "suspended" if self.leadership and self.leadership.suspended else "connected"
        out["redis"] = self.store.health() if self.store else "ok"
        out["streaming"] = int(state.streaming)
        out["streaming_since"] = state.streaming_since
        out["pid"] = os.getpid()
        out["version"] = __version__  # a rolling upgrade shows which peers run which twinflow
        out["events_dropped"] = self.events.dropped
        # On the flow's clock (Redis's time), so that peers on different machines agree on when.
        out["at"] = round(self.clock.now(), 3)
        at, size, took = self.intake.last_batch or (0.0, 0, 0.0)
        out["last_batch_at"], out["last_batch_size"], out["last_batch_s"] = round(at, 3), size, round(took, 4)
        offset = getattr(self.clock, "offset_s", None)  # a flow clock on Redis's time knows it (flow_clock.py)
        if offset is not None:
            out["clock_offset_s"] = round(offset, 3)
        if self.intake.task_pid:
            out["task_pid"] = self.intake.task_pid
            out["state_loads"] = self.intake.state_loads
        try:
            behind = self.store.uplink_behind(self.cfg.peer_id) if self.store else (0, 0.0)
            out["uplink_lag"], out["uplink_lag_s"] = behind
        except Exception:  # status must answer even when Redis does not
            out["uplink_lag"], out["uplink_lag_s"] = -1, -1.0
        return out
