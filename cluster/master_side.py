"""A member as master: its term's session, what it does with a session's outcome, and stepping down.

A term begins at promotion with a :class:`~twinflow.cluster.master_session.MasterSession`
at the new epoch, and ends when the member steps down or is demoted (the session is ended,
so no step of it is sent after that). The session runs the batches and fires the
deadlines and returns what it did; :class:`MasterSide` acts on that: counts, claims to
escalate, a refusal. A sharded flow's executors run the master's batches themselves and
return the same (:meth:`MasterSide.took_executor_batch`).

Under failure (promise 3): a write the fence refuses, or one that cannot reach Redis
within the write lease, makes the member step down; the session drops its flow on any
failed step, so the next step is built on the state Redis holds.

After a promotion's catch-up, the term's first committed step that ran messages is logged
once (``first_write``, with how long after the fence it came): a check per outcome, nothing
per message.
"""

from __future__ import annotations

import logging
from collections import Counter
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from ..runtime.message import Message
from ..runtime.store.store_errors import Fenced, RedisUnavailable
from .batch_phases import NO_PHASES, BatchPhases
from .master_flow import MasterFlow
from .master_outcome import Outcome
from .master_session import MasterSession
from .roles import MASTER, WORKER
from .timings import LATENESS_BUCKETS, Timings

if TYPE_CHECKING:
    from .escalation_servicer import Claim
    from .member import FlowMember
    from .shard_task import ShardResult

log = logging.getLogger("twinflow.peer")

# A sharded flow's master fires a time-out itself once this long has passed without a batch
# (whose executor would have fired it): the most a time-out waits for that under no load.
REMOTE_FIRE_AFTER_S = 0.25
BUSY_RETRY_S = 0.05  # how soon the timer looks again at a deadline a batch in progress holds up


class MasterSide:
    """A member's master term and what it does with its outcomes (see the module doc)."""

    def __init__(self, member: "FlowMember", writes: Executor | None):
        self.m = member
        self.writes = writes  # where the master's COMMITs go from (master_session)
        self.session: MasterSession | None = None  # the term: its flow, a cache of its state in Redis
        self.open_in_flow = 0  # what the flow held open after the last step (status reads this, not the flow)
        self.pending_nodes: dict[str, dict] = {}  # the same per node (MasterFlow.pending_nodes), for status
        self.links: dict[tuple[str, str], int] = {}  # (node, outlink) -> messages the link took this term
        self.remote_deadline: float | None = None  # the flow's next deadline, as an executor's batch left it
        self.remote_batch_at = float("-inf")  # monotonic time of the last batch an executor ran as master
        # Whether the executors keep the flow (its next deadline is remote_deadline): from an
        # executor's batch until this member runs or fires the flow itself again.
        self.kept_by_executors = False
        self.driver_steps = 0     # steps this member committed itself (an executor's kept flow is then stale)
        self.left: Counter = Counter()  # stream -> messages committed master steps sent there
        self.lateness = Timings(LATENESS_BUCKETS)  # how late due deadlines fired (flow clock)
        self._first_write: tuple[int, float] | None = None  # (epoch, promoted_at) until the term's first write

    @property
    def flow(self) -> MasterFlow | None:
        """The master's flow, a cache of its state in Redis (None: not master, or not loaded)."""
        session = self.session
        return session.flow if session is not None else None

    # -- the term ---------------------------------------------------------------
    def begin_term(self, epoch: int) -> MasterSession:
        """A new session at ``epoch``, with the state the old master committed loaded."""
        self.end_term()
        m = self.m
        session = MasterSession(m.graph, m.store, epoch, self.writes, left=self.left, warm=m.warm)
        self.session = session
        self.remote_deadline = None
        self.kept_by_executors = False
        session.load()
        self.note_open()
        return session

    def watch_first_write(self, epoch: int, promoted_at: float) -> None:
        """Log the term's next committed step that runs messages as its first write (``first_write``),
        ``promoted_at`` being when its fence was raised (the flow's clock). Called once the
        promotion's catch-up is done, holding batch_lock."""
        self._first_write = (epoch, promoted_at)

    def end_term(self) -> None:
        self._first_write = None
        session, self.session = self.session, None
        if session is not None:
            session.end()

    def step_down(self, reason: str) -> None:
        """Leave the role: a worker from now on, the term ended, the election told."""
        self.m.state.become(WORKER)
        self.end_term()
        self.m.leadership.step_down(reason)

    # -- batches and deadlines -----------------------------------------------------
    def run(self, msgs: list[Message], epoch: int, last: str, phases: BatchPhases = NO_PHASES) -> list[Message] | None:
        """Run a batch through the flow as master at ``epoch`` (caller holds batch_lock); None when
        all of it was committed, else the uncommitted rest, after this member stopped being master."""
        session = self.session
        if session is None or session.epoch != epoch or not session.active:
            return msgs
        self.kept_by_executors = False  # the flow is this member's now (held, or loaded when needed)
        out = session.run_batch(msgs, last, self.m.clock.now, phases)
        with phases.timed("escalation"):
            self._act_on(out)
        if out.rest is None:
            self.m.wake.set()  # the step may have opened an earlier deadline
        return out.rest

    def fire_due(self, now: float) -> float | None:
        """As master, fire the flow's deadlines due at ``now`` and commit what they did;
        returns the next deadline. A batch in progress fires them itself, so this never waits
        for one; and the flow is only read holding the member (``batch_lock``), never while a batch
        builds a step on it or drops it."""
        m = self.m
        if m.state.role != MASTER:
            return None
        if not m.batch_lock.acquire(blocking=False):
            # A batch holds the member and fires them itself (an executor's, before its batch);
            # look again shortly rather than spin on a deadline already past.
            return now + BUSY_RETRY_S
        try:
            session, flow = self.session, self.flow
            if flow is None and not self.kept_by_executors and session is not None and session.active:
                # A flow dropped after a failed step, with no executor keeping one: load it, else its
                # deadlines would wait for the next batch, and after the last batch fire never.
                flow = session.load()
            due = flow.next_deadline() if flow is not None else self.remote_deadline
            resume = False
            if flow is not None and (held := flow.suspensions()):
                resume = m.store.resume_requested(held, deadline_s=0)  # twinflow resume
            if not resume and (due is None or due > now):
                return due
            if flow is None:
                # Executors run this shard's batches and fire what is due first, on a flow they
                # keep; firing here would load the whole state. Only when no batch came lately.
                quiet = m.monotonic() - self.remote_batch_at
                if quiet < REMOTE_FIRE_AFTER_S:
                    return now + REMOTE_FIRE_AFTER_S - quiet
            # A flow dropped is loaded again by the session.
            if m.state.role == MASTER and m.leadership.may_write() and session is not None and session.active:
                if due is not None and due <= now:
                    self.lateness.observe(now - due)  # once per firing round: the earliest due
                self.kept_by_executors = False  # fired here, on a flow held or loaded here
                self._act_on(session.fire(now, resume=resume))
            flow = self.flow
            return flow.next_deadline() if flow is not None else None
        finally:
            m.batch_lock.release()

    def took_executor_batch(self, r: "ShardResult") -> None:
        """What an executor did as master with this shard's batch (caller holds batch_lock):
        its claims sent, a step-down if its writes were refused."""
        if self.session is not None:
            self.session.drop()  # the executor committed: a flow here is behind Redis
        self.kept_by_executors = True
        self.remote_deadline = r.next_deadline
        self.remote_batch_at = self.m.monotonic()
        if r.delivered and self._first_write is not None:
            self._wrote_first()
        if r.claims and self.m.spec.pair is not None:
            self.escalate(r.claims)
        if r.fenced_by:
            self.refused(Fenced(r.epoch, r.fenced_by))
        elif r.unreachable:
            self.lost_redis(r.unreachable)

    def count_left(self, left: Counter) -> None:
        """Messages an executor's committed steps sent to each stream."""
        self.left.update(left)

    # -- outcomes ------------------------------------------------------------------
    def _act_on(self, out: Outcome) -> None:
        """Count what a session did, escalate its claims, step down if it was refused."""
        self.m.state.count(delivered=out.delivered, skipped=out.skipped, failed=out.failed)
        self.driver_steps += out.steps
        if out.delivered and self._first_write is not None:
            self._wrote_first()
        if out.claims:
            self.escalate(out.claims)
        if out.refused is not None:
            self.refused(out.refused)
        self.note_open()

    def _wrote_first(self) -> None:
        """The term's first write after its catch-up was committed just now: log it, once."""
        watched, self._first_write = self._first_write, None
        if watched is None:
            return
        epoch, promoted_at = watched
        m = self.m
        now = m.clock.now()
        m.event(logging.INFO, "first_write", "%s wrote its first step as master at epoch %d, %.3f s after its "
                "promotion", m.cfg.peer_id, epoch, now - promoted_at, epoch=epoch, first_write_at=round(now, 3),
                since_promoted_s=round(now - promoted_at, 3))

    def escalate(self, claims: list[Claim]) -> None:
        """Send the claims of committed steps, to each target only those of messages it has
        read (``escalation.read_by``): how far each has handled the uplink is read here, after
        the COMMITs. A worker reading behind has read few of them. Redis unreachable in that
        one try: every claim goes (a claim is a hint; the worker's Redis check decides)."""
        sender = self.m.sender
        targets = sender.target_ids()
        try:
            upto = self.m.store.handled_positions(targets, deadline_s=0) if targets else None
        except RedisUnavailable:
            upto = None
        sender.send(claims, upto)

    def refused(self, exc: Fenced | RedisUnavailable) -> None:
        """A write of this master (here or on an executor) was refused or never got through."""
        if not isinstance(exc, Fenced):
            self.lost_redis(str(exc))
            return
        m = self.m
        m.event(logging.ERROR, "fenced", "%s: %s; stepping down", m.cfg.peer_id, exc,
                epoch=exc.epoch, newest=exc.newest)
        m.state.saw_epoch(exc.newest)
        m.state.count(fenced=1)
        self.step_down("fenced")

    def lost_redis(self, why: str) -> None:
        m = self.m
        m.event(logging.ERROR, "lease_expired", "%s: %s; over the write lease (%.1f s): stepping down",
                m.cfg.peer_id, why, m.lease_s, reason=why, lease=m.lease_s)
        self.step_down("Redis unreachable")

    def note_open(self) -> None:
        """Count what the flow holds open, in all and per node, for status (caller holds batch_lock:
        status itself never reads the flow, which a batch may be building a step on). Once per
        step, never per message: a count per node, read from each node's own counters."""
        flow = self.flow
        if flow is not None:
            nodes = flow.pending_nodes()
            self.pending_nodes = nodes  # one assignment: status reads the whole dict or the last one
            self.links = dict(flow.engine.passed)  # a copy under the lock; named for status when it is read
            self.open_in_flow = sum(n["held"] for n in nodes.values())
            self.m.reader.set_suspended(flow.suspensions())  # the master knows first: hold at once
