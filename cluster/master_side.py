"""A member as master: its term's session, what it does with a session's outcome, and stepping down.

A term begins at promotion with a :class:`~twinflow.cluster.master_session.MasterSession`
at the new epoch, and ends when the member steps down or is demoted (the session is ended,
so no step of it is sent after that). The session runs the batches and fires the
deadlines; this side acts on what it returns: counts, claims to escalate, a refusal.

Under failure (promise 3): a write the fence refuses, or one that cannot reach Redis
within the write lease, makes the member step down; the session drops its flow on any
failed step, so the next step is built on the state Redis holds.
"""

from __future__ import annotations

import logging

from ..runtime.message import Message
from ..runtime.store.store_errors import Fenced, RedisUnavailable
from .master_flow import MasterFlow
from .master_session import MasterSession, Outcome
from .roles import WORKER

log = logging.getLogger("twinflow.peer")


class MasterSide:
    """A member's master term (mixed into FlowMember)."""

    session: MasterSession | None

    @property
    def flow(self) -> MasterFlow | None:
        """The master's flow, a cache of its state in Redis (None: not master, or not loaded)."""
        session = self.session
        return session.flow if session is not None else None

    def _begin_term(self, epoch: int) -> MasterSession:
        """A new session at ``epoch``, with the state the old master committed loaded."""
        self._end_term()
        session = MasterSession(self.graph, self.store, epoch, self.writes, left=self.left, warm=self.warm)
        self.session = session
        session.load()
        self._note_open()
        return session

    def _end_term(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.end()

    def _run_master(self, msgs: list[Message], epoch: int, last: str) -> list[Message] | None:
        """Run a batch through the flow as master at ``epoch`` (caller holds batch_lock); None when
        all of it was committed, else the uncommitted rest, after this member stopped being master."""
        session = self.session
        if session is None or session.epoch != epoch or not session.active:
            return msgs
        out = session.run_batch(msgs, last, self.clock.now)
        self._act_on(out)
        if out.rest is None:
            self._wake.set()  # the step may have opened an earlier deadline
        return out.rest

    def _fire(self, now: float) -> None:
        """Fire the flow's deadlines due at ``now`` (caller holds batch_lock, as master)."""
        session = self.session
        if session is not None and session.active:
            self._act_on(session.fire(now))

    def _act_on(self, out: Outcome) -> None:
        """Count what a session did, escalate its claims, step down if it was refused."""
        with self._lock:
            self.delivered += out.delivered
            self.skipped += out.skipped
            self.failed += out.failed
        self.driver_steps += out.steps
        if out.claims:
            self.escalate(out.claims)
        if out.refused is not None:
            self.refused(out.refused)
        self._note_open()

    def escalate(self, claims: list[tuple[str, str, str, str]]) -> None:
        """Send the claims of committed steps, to each target only those of messages it has
        read (``escalation.read_by``): how far each has handled the uplink is read here, after
        the COMMITs. A worker reading behind has read few of them. Redis unreachable in that
        one try: every claim goes (a claim is a hint; the worker's Redis check decides)."""
        targets = self.sender.target_ids()
        try:
            upto = self.store.handled_positions(targets, deadline_s=0) if targets else None
        except RedisUnavailable:
            upto = None
        self.sender.send(claims, upto)

    def refused(self, exc: Fenced | RedisUnavailable) -> None:
        """A write of this master (here or on an executor) was refused or never got through."""
        if not isinstance(exc, Fenced):
            self._lost_redis(str(exc))
            return
        self._event(logging.ERROR, "fenced", "%s: %s; stepping down", self.cfg.peer_id, exc,
                    epoch=exc.epoch, newest=exc.newest)
        with self._lock:
            self.known_epoch = max(self.known_epoch, exc.newest)
            self.fenced += 1
        self._step_down("fenced")

    def _lost_redis(self, why: str) -> None:
        self._event(logging.ERROR, "lease_expired", "%s: %s; over the write lease (%.1f s): stepping down",
                    self.cfg.peer_id, why, self.lease_s, reason=why, lease=self.lease_s)
        self._step_down("Redis unreachable")

    def _note_open(self) -> None:
        """Count what the flow holds open, for status (caller holds batch_lock: status itself never
        reads the flow, which a batch may be building a step on)."""
        flow = self.flow
        if flow is not None:
            self.open_in_flow = flow.pending()

    def _step_down(self, reason: str) -> None:
        with self._lock:
            self.role = WORKER
        self._end_term()
        self.leadership.step_down(reason)
