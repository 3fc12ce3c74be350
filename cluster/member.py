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

Promises under failure (numbered as in docs/concepts/promises.md) are each kept by the module
that holds the concern, and said in its docstring:

- ``batch_intake``: batches processed whole or not committed, run ahead (1);
- ``master_side``: the master's steps, fencing and stepping down (3);
- ``promotion``: fence, catch up, roll back on promotion (1, 2);
- ``claims``: escalations admitted only from the master; claims proven (1, 3);
- ``backpressure``: a worker never drops, it stops reading (5);
- ``member_timers``: deadlines, bake expiry, sweep, trim, status, lease (1, 3, 4);
- ``start_position``: where a member starts reading, and what it refuses.

The member lock (``_lock``) guards memory only and is never held across a
Redis call, so handover and status answer while Redis hangs; ``batch_lock``
admits one batch or one promotion catch-up at a time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from concurrent.futures import Future

from ..logs import event
from ..runtime.clock import Clock, SystemClock
from ..runtime.flowgraph import FlowGraph
from ..runtime.message import Message
from ..runtime.nodes.sort import ClaimSortNode
from ..runtime.store.flow_store import FlowStore
from .backpressure import Backpressure
from .batch_intake import BatchIntake
from .claims import Claims, NoPair
from .escalation import EscalationSender
from .peer_config import PeerConfig
from .leadership import Leadership
from .master_flow import logged_nodes
from .master_session import MasterSession
from .master_side import MasterSide
from .timings import LATENESS_BUCKETS, BatchTimings, Timings
from .parts import MemberParts
from .member_timers import MemberTimers
from .on_cluster import cluster_flow, flow_keys
from .promotion import Promotion
from .roles import MASTER, STARTING, WORKER
from .start_position import StartPosition
from .warm_state import WarmState

log = logging.getLogger("twinflow.peer")


class FlowMember(StartPosition, BatchIntake, MasterSide, Claims, Promotion, Backpressure, MemberTimers):
    """A peer's part in one flow (or one shard of it): one side of an active-active pair (see the module doc)."""

    def __init__(self, graph: FlowGraph, config: PeerConfig, *, parts: MemberParts, clock: Clock | None = None,
                 monotonic=time.monotonic, pause=None):
        """``parts`` builds the member's collaborators (``real_parts.RealParts`` for real servers);
        ``clock`` gives the flow's time, ``monotonic`` the timers' local intervals and ``pause(s)``
        the wait of a held batch (default: until stopped); a simulator passes its virtual clock."""
        spec = cluster_flow(graph)
        self.parts = parts
        self.writes = self.parts.writes()  # where the master's COMMITs go from (master_session)
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
        self.sort = ClaimSortNode(pair.rules.bake_times(), pair.unclaimed_outlink, pair.max_pending) \
            if pair else NoPair()
        self.session: MasterSession | None = None  # the master's term: its flow, a cache of its state in Redis
        self.open_in_flow = 0  # what the flow held open after the last step (status reads this, not the flow)
        self.remote_deadline: float | None = None  # the flow's next deadline, as an executor's batch left it
        self.remote_batch_at = float("-inf")  # monotonic time of the last batch an executor ran as master
        self.driver_steps = 0     # steps this member committed itself (an executor's kept flow is then stale)
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
        self.epoch = 0            # this member's epoch while master
        self.known_epoch = 0      # the newest epoch this member has seen anywhere
        self.delivered = 0
        self.skipped = 0          # already processed when the master got them
        self.failed = 0
        self.rolled_back = 0      # delivered by promotion catch-up
        self.claims_unproven = 0  # claimed messages Redis did not show processed: they bake on
        self.escalations_refused = 0  # batches not from the master at its epoch (admit_escalation)
        # For the metrics (cluster/metrics.py), counted per batch or step, never per message:
        self.escalations_taken = 0  # escalation batches admitted (on_claims)
        self.read = 0             # uplink entries this member read (the warm-up row is none)
        self.fenced = 0           # writes as master the fence refused (each a step-down)
        self.left: Counter = Counter()  # stream -> messages committed master steps sent there
        self.batch_timings = BatchTimings((MASTER, WORKER))  # batch durations by role
        self.lateness = Timings(LATENESS_BUCKETS)  # how late due deadlines fired (flow clock)
        self.held = False         # backpressure: the reader plans no batch
        self._paced_ms: tuple[int, int] | None = None  # the reader's pace and read-behind as last set
        self._pace_lock = threading.Lock()  # the timer and a promotion both set the pace
        self.holding = False      # a master batch waits for ZooKeeper to come back
        self.handled_upto: str | None = None  # the last uplink position this member handled
        self.streaming = False
        self.streaming_since = 0.0
        self._lock = threading.Lock()   # memory only: never held across a Redis call
        self.batch_lock = threading.Lock()  # one batch or one promotion catch-up at a time
        self._stop = threading.Event()
        self._pause = pause or self._stop.wait
        self._wake = threading.Event()
        self._stopped = False
        self._to_surface: list[Message] = []
        self.store: FlowStore | None = None
        self.warm: WarmState | None = None  # a worker's warm copy of the history (warm_state.py)
        self.zk = None
        self.leadership: Leadership | None = None
        self.sender: EscalationSender | None = None
        self.health = None        # the peer's, shared by its members (prepare)
        self.address = ""
        self.reading = None       # the peer's uplink reading (read_with)

    # -- life cycle (driven by the peer, peer.py) ----------------------------
    def open_store(self) -> None:
        """Connect to Redis (waiting up to the deadline) and check that it can keep the promises."""
        self.store = self.parts.store(self)
        self._check_redis()
        if logged_nodes(self.graph):
            self.warm = WarmState(self.graph, self.store, monotonic=self.monotonic)

    def prepare(self, peer) -> dict:
        """Check the fencing epoch against the peer's ZooKeeper, choose where to start reading
        (StartRefused when that could break a promise); returns the start position."""
        self.health = peer.health
        self.zk = peer.zk
        self._guard_epoch(self._zookeeper_epoch())
        self.handled_upto = self.store.handled_position()
        resuming = (self.checkpoint_dir().parent / "start.json").exists()
        start = self._start_position()
        self._check_retention(resuming)
        return start

    def serve(self, peer) -> None:
        """Escalate from, and take part in the election at, the peer's gRPC address; start the timers."""
        self.address = peer.address
        self.sender = self.parts.sender(self)
        with self._lock:
            self.role = WORKER
        self.leadership = self.parts.leadership(self)
        self.leadership.start()
        self.parts.start_timers(self)

    def read_with(self, reading) -> None:
        """The peer's reading now runs: this member holds and paces it from here on."""
        self.reading = reading
        self._pace()
        self._event(logging.INFO, "started", "%s started reading %s (gRPC %s); ready after the warm-up batch",
                    self.cfg.peer_id, self.keys.uplink, self.address, address=self.address)

    def _zookeeper_epoch(self) -> int:
        stat = self.zk.exists(f"/twinflow/{self.name}/epoch")
        return stat.version if stat else 0

    def _guard_epoch(self, seen: int, deadline_s: float | None = None) -> None:
        """Raise Redis's fencing epoch to the newest this member has seen (it must never go back)."""
        in_redis = self.store.current_epoch(deadline_s=deadline_s)
        newest = max(seen, in_redis, self.known_epoch)
        if in_redis < newest:
            self._event(logging.WARNING, "redis_epoch_behind",
                        "Redis's fencing epoch is %d but epoch %d exists (Redis lost data?): raising it",
                        in_redis, newest, in_redis=in_redis, epoch=newest)
            newest = self.store.raise_epoch(newest, deadline_s=deadline_s)
        with self._lock:
            self.known_epoch = max(self.known_epoch, newest)

    def stop_member(self) -> None:
        """Stop taking batches: a batch waiting for Redis raises now and is not committed."""
        if self._stopped:
            return
        self._stopped = True
        self._event(logging.INFO, "stopping", "%s stopping (%s)", self.cfg.peer_id, self.role, role=self.role)
        self._stop.set()
        self._wake.set()
        if self.store is not None:
            self.store.close()

    def settle(self) -> None:
        """Once the reading stopped: let a batch running ahead end, leave the election, stop sending."""
        try:
            self._settle_ahead(timeout_s=max(5.0, 2 * self.lease_s))
        except Exception:  # logged by the batch thread; handled_id covers the batch
            pass
        if self.leadership is not None:
            self.leadership.stop()
        if self.sender is not None:
            self.sender.stop()

    def _event(self, level: int, name: str, msg: str, *args, **fields) -> None:
        """Log the operator event ``name`` (``twinflow.logs``) with this member's flow, peer ID and epoch (its
        own as master, else the newest it has seen, left out while none is: epochs start at 1;
        ``epoch=`` overrides it). Reads without the lock, so it may be called holding it."""
        fields.setdefault("epoch", (self.epoch if self.role == MASTER else self.known_epoch) or None)
        event(log, level, name, msg, *args, flow=self.name, peer=self.cfg.peer_id, **fields)

    def status(self) -> dict:
        with self._lock:
            out = {
                "flow": self.name,
                "peer_id": self.cfg.peer_id,
                "node_id": self.cfg.peer_id,  # peer_id under its old name, kept one release for readers
                "role": self.role,
                "epoch": self.epoch if self.role == MASTER else self.known_epoch,
                "pending": self.open_in_flow if self.flow is not None else 0,
                "baked": self.sort.pending,
                "claimed": self.sort.claimed,
                "rolled_back": self.rolled_back,
                "claims_unproven": self.claims_unproven,
                "escalations_refused": self.escalations_refused,
                "escalations_taken": self.escalations_taken,
                "delivered": self.delivered,
                "failed": self.failed,
                "unclaimed": self.sort.unclaimed,
                "nohit": self.sort.nohit,
                "rule_pending": self.sort.rule_pending(),  # RULE_PEND: held per ruleset of the claim pair
                "backpressure": int(self.held),
                "holding": int(self.holding),
                "grpc_address": self.address,
            }
        out["zookeeper"] = "suspended" if self.leadership and self.leadership.suspended else "connected"
        out["redis"] = self.store.health() if self.store else "ok"
        out["streaming"] = int(self.streaming)
        out["streaming_since"] = self.streaming_since
        out["pid"] = os.getpid()
        offset = getattr(self.clock, "offset_s", None)  # a flow clock on Redis's time knows it (flow_clock.py)
        if offset is not None:
            out["clock_offset_s"] = round(offset, 3)
        if self.task_pid:
            out["task_pid"] = self.task_pid
            out["state_loads"] = self.state_loads
        try:
            out["uplink_lag"] = self.store.uplink_lag(self.cfg.peer_id) if self.store else 0
        except Exception:  # status must answer even when Redis does not
            out["uplink_lag"] = -1
        return out
