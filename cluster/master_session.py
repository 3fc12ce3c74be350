"""A master's session on one flow at one epoch: batches run in fenced COMMIT steps, and the
flow's deadlines fired, each returning what it did.

One session for every place a master runs the flow: a peer's driver
(``member.FlowMember``, one session per term, made at promotion), a promoted
worker's catch-up (the same session), an executor running one uplink shard's
partition (``shard_task``, a session per task), the failover simulator and
the benches. :meth:`MasterSession.run_batch` and :meth:`MasterSession.fire`
never call back into their caller: they return an :class:`Outcome` (counts,
the claims to escalate, why the session ended early, the uncommitted rest),
and the caller acts on it (escalates, steps down, bakes the rest).

Promises (promise 1): a message is run through the flow only if it is not
processed (not at or before the processed mark, ID not in the ID cache, not a
repeat inside the batch), and it counts as processed once the COMMIT of its
step succeeded. With a flow loaded the session guesses which messages are
new from the mark the flow holds, and each COMMIT applies only if the guess
was right; a wrong guess (a message re-published with an ID the flow
processed) writes nothing, and the rest of the batch runs again after asking
Redis. Every step also names the state version it was built from
(``MasterFlow.version``), and Redis applies it only on that version: a step
built on state another writer has moved since (a second attempt of a shard
task, another process that ran the shard's last batch, a flow reloaded while
a step was in flight) writes nothing, and the session builds it again on the
state Redis holds. A COMMIT that is refused (Fenced) or cannot reach Redis
ends the session at that step (``Outcome.refused``): the messages from there
on are returned uncommitted, and every later call does nothing.

Bad input is data, never a failed batch: a message the flow raises an error
for (``MasterFlow.run`` raises MessageRefused), or whose step redis-py cannot
encode (found by running the failing step's messages one per step), goes to
the failure stream with its reason, keyed by its uplink position, and the
batch goes on without it.

A handler guarded by a history with external completion (``guards_handlers``)
runs only after its "processing" entry is in Redis (``FlowStore.record_started``,
fenced by the term's epoch), so such a flow's session never builds a step
while the one before is in flight (the entry must not land before an older
step's write of the same entry), and never guesses (a guess found wrong
builds the step again, and the messages whose handlers ran would come back
In Doubt): it asks Redis which messages are processed first. A step built
again for another reason (a message the flow refused, another writer) finds
the messages whose handlers ran In Doubt, which is what they are.

Overlap: while a batch's steps are in Redis (sent from writer threads, see
:func:`write_pool`), the session builds the next step on the flow. Up to
``STEPS_IN_FLIGHT`` writes of a batch are in flight, chained: each is sent
only once the one before it succeeded (its writer waits for that first), so
steps commit in order and a refused one is the last. The steps behind a
refused one are never sent; they are dropped with the flow. Each step is
guarded by the mark and names the version the steps before it leave, so a
step sent behind one still in Redis applies only on what that one wrote.
Claims and counts follow a step's COMMIT, never its build. The failover
simulator passes an executor that runs each write when its schedule says
(``chaos/sim``), so virtual time stays deterministic.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from concurrent.futures import Executor, Future
from typing import Callable

import redis

from ..runtime.flowgraph import FlowGraph
from ..runtime.message import Message
from ..runtime.positions import position_order
from ..runtime.store.flow_store import FlowStore, chunked
from ..runtime.store.store_errors import Fenced, GuessWrong, RedisUnavailable
from ..runtime.store.step import Step
from .batch_phases import NO_PHASES, BatchPhases
from .master_flow import MasterFlow, MessageRefused, guards_handlers
from .master_outcome import Outcome
from .uplink_rows import record_bad
from .warm_state import WarmState
from .write_pool import write_pool


log = logging.getLogger("twinflow.master")

# How many of a batch's steps may be in Redis at once. Two: the next step is sent while the
# one before it still waits behind other clients' scripts in Redis (a reader's batch of 10,000
# entries holds Redis 18-300 ms), so the batch thread builds on instead of waiting for it;
# one for a flow that guards handlers (the module doc says why).
STEPS_IN_FLIGHT = 2

# How many times in a row a step may be refused as built on state behind Redis before the
# batch fails (and Spark runs the task again): each refusal means another writer committed,
# so a run that keeps losing is one that keeps others making progress.
MAX_ROUNDS = 64

# What redis-py raises for a value it cannot send (a text no UTF-8 encoder takes, a value
# of a type it does not write): raised before anything is sent, so nothing was written.
UNWRITABLE = (UnicodeError, redis.DataError)


class Contended(RuntimeError):
    """Every round of a batch or a firing was refused as behind Redis (MAX_ROUNDS)."""


class MasterSession:
    """One master term on one flow: ``epoch`` is the term's, ``store`` the flow's (or shard's).

    ``flow``: a flow kept from before (an executor's, for the same epoch), else loaded
    from Redis when first needed. ``left`` counts what committed steps sent through
    each outlink. :meth:`end` (from any thread) stops the session between steps."""

    def __init__(self, graph: FlowGraph, store: FlowStore, epoch: int, writes: Executor | None = None, *,
                 flow: MasterFlow | None = None, left: Counter | None = None, warm: WarmState | None = None):
        self.graph, self.store, self.epoch = graph, store, epoch
        self.warm = warm  # a worker's warm copy, for the first load of the term (warm_state.py)
        self.spec = graph.cluster
        self.writes = writes if writes is not None else write_pool()
        self.left = left if left is not None else Counter()
        self.flow = flow
        if flow is not None:
            flow.left = self.left
        self.state_loads = 0  # whole-state loads from Redis
        self.guarded = guards_handlers(graph)
        self._ended = threading.Event()
        self.phases: BatchPhases = NO_PHASES  # the batch being run's phases, if timed (batch_phases.py)

    # -- the session ------------------------------------------------------
    @property
    def active(self) -> bool:
        return not self._ended.is_set()

    def end(self) -> None:
        """The term is over (stepped down, demoted, refused): no further step is sent."""
        self._ended.set()
        self.flow = None

    def load(self) -> MasterFlow:
        """The flow to build on: the one held, or the state Redis holds (may raise RedisUnavailable)."""
        flow = self.flow
        if flow is None:
            warm, self.warm = self.warm, None  # only the term's first load: the copy is taken whole
            flow = warm.take(deadline_s=self.spec.write_lease) if warm is not None else None
            if flow is None:
                self.state_loads += 1
                with self.phases.timed("state_load"):
                    flow = MasterFlow.load(self.graph, self.store, deadline_s=self.spec.write_lease)
            flow.left = self.left
            self.flow = flow
        if self.guarded:
            flow.write_started = self._write_started
        return flow

    def _write_started(self, node: str, key: str, at: float) -> None:
        spec = self.spec
        self.store.record_started(self.epoch, node, key, at, deadline_s=spec.write_lease,
                                  replicas=spec.wait_replicas, replica_wait_ms=spec.replica_wait_ms)

    def drop(self) -> None:
        """Forget the flow (it may be ahead of or behind Redis): the next step loads it again."""
        self.flow = None

    def next_deadline(self) -> float | None:
        flow = self.flow
        return flow.next_deadline() if flow is not None else None

    # -- firing -----------------------------------------------------------
    def fire(self, now: float, guess: bool = False, resume: bool = False) -> Outcome:
        """Fire the flow's deadlines due at ``now`` in one step and COMMIT it (with ``resume``, its
        suspended action nodes resume first: MasterFlow.fire). With ``guess``,
        a flow held from before fires only if Redis's mark is the one it holds; a step refused
        as built on state behind Redis is built again on the state Redis holds."""
        out = Outcome()
        for _ in range(MAX_ROUNDS):
            if not self.active:
                return out
            try:
                flow = self.load()
                step = flow.fire(now, self.epoch, resume)
                self._write(flow, step, guess).result()
            except (Fenced, RedisUnavailable) as exc:
                self._refuse(out, exc)
                return out
            except GuessWrong:
                self.drop()  # another writer moved the state: fire on what it left
                guess = False
                continue
            except BaseException:
                self.drop()
                raise
            flow.committed(step)
            out.steps += 1
            return out
        raise Contended(f"a step was refused as behind Redis {MAX_ROUNDS} times in a row")

    # -- batches ----------------------------------------------------------
    def run_batch(self, msgs: list[Message], last: str, now: Callable[[], float],
                  phases: BatchPhases = NO_PHASES) -> Outcome:
        """Run ``msgs`` (ending at uplink position ``last``) through the flow; guesses from the
        flow held, if any, else asks Redis which messages are processed first. ``phases``: where
        the batch's time goes is added to it (batch_phases.py)."""
        self.phases = phases
        try:
            return self._run_batch(msgs, last, now)
        finally:
            self.phases = NO_PHASES

    def _run_batch(self, msgs: list[Message], last: str, now: Callable[[], float]) -> Outcome:
        out = Outcome()
        sent, rounds = 0, 0
        guess = self.flow is not None and not self.guarded
        while True:
            try:
                out.rest = self._run_steps(out, msgs[sent:], last, guess, now)
                return out
            except _GuessRefused as wrong:
                # A message processed before, or another writer (a second attempt of a shard
                # task, a process that ran this shard's last batch) committed since the flow
                # was loaded: ask Redis which of the rest are processed and build on its state.
                log.info("a step was built on state behind Redis; running the rest of the batch again "
                         "from Redis's view")
                sent += wrong.sent
                rounds += 1
                if rounds >= MAX_ROUNDS:
                    raise Contended(f"a batch's steps were refused as behind Redis {MAX_ROUNDS} times in a row") \
                        from None
            except _Unwritable as bad:
                sent += bad.sent
                # The step that could not be written starts at ``sent`` and holds at most this many.
                handled = self._isolate(out, msgs[sent:sent + self.spec.step_messages], now, bad.exc)
                if handled is None:
                    out.rest = msgs[sent:]
                    return out
                sent += handled
            guess = False

    def _write(self, flow: MasterFlow, step: Step, guess: bool, mark: str | None = None,
               after: Future | None = None) -> Future:
        """Send ``step``'s COMMIT within the write lease, guarded by ``mark`` (default: the one
        ``flow`` holds now) when ``guess``, and only once ``after`` (the step before it, still in
        flight) succeeded; the future raises what the store raises (Fenced, GuessWrong,
        RedisUnavailable), or _NotSent when ``after`` did not succeed."""
        spec = self.spec
        store, epoch = self.store, self.epoch
        guarded = (mark if mark is not None else flow.mark,) if guess else None

        def write() -> None:
            if after is not None:
                try:
                    after.result()
                except BaseException:
                    raise _NotSent() from None
            store.commit(epoch, step, deadline_s=spec.write_lease, replicas=spec.wait_replicas,
                         replica_wait_ms=spec.replica_wait_ms, guess=guarded)

        return self.writes.submit(write)

    def _refuse(self, out: Outcome, exc: Fenced | RedisUnavailable) -> None:
        out.refused = exc
        self.end()

    def _run_steps(self, out: Outcome, msgs: list[Message], last: str, guess: bool,
                   now: Callable[[], float]) -> list[Message] | None:
        guess_from = self.flow if guess else None
        guess = guess_from is not None
        if guess_from is not None:
            done = [guess_from.is_processed(m) for m in msgs]
        else:
            try:  # already processed (or a repeat inside this batch): never run through the graph again
                done = self.store.processed(msgs, deadline_s=self.spec.write_lease)
            except RedisUnavailable as exc:
                self._refuse(out, exc)
                return msgs
            except UNWRITABLE as exc:  # an ID no key can be made of
                raise _Unwritable(0, exc) from exc
        seen: set[str] = set()
        run = []
        for m, d in zip(msgs, done):
            run.append(not d and m.id not in seen)
            seen.add(m.id)
        at = 0  # where the next chunk starts
        chunks = list(chunked(msgs, max_count=self.spec.step_messages)) or [[]]
        writing = _InFlight(self, out)
        whole = False  # every chunk's step was sent
        try:
            for i, chunk in enumerate(chunks):
                if not self.active:
                    break
                fresh = [m for m, r in zip(chunk, run[at:at + len(chunk)]) if r]
                at += len(chunk)
                # The last chunk's step moves the mark past the whole batch (bad entries included).
                mark = last if i == len(chunks) - 1 else chunk[-1].position
                if self.guarded and not writing.settle():
                    break
                built = self._build(out, writing, fresh, mark, now)  # while the steps before are in Redis
                if built is None or not writing.make_room():
                    break
                flow, step, fresh = built
                writing.send(flow, step, guess, chunk, fresh)
            else:
                whole = True
            whole = writing.settle() and whole
        except (_GuessRefused, _Unwritable):
            raise
        except BaseException:
            writing.abandon()
            raise
        return None if whole else msgs[writing.sent:]

    def _build(self, out: Outcome, writing: "_InFlight", fresh: list[Message], mark: str,
               now: Callable[[], float]) -> tuple[MasterFlow, Step, list[Message]] | None:
        """Build the step that runs ``fresh`` on the flow: (flow, step, the messages it runs),
        or None when Redis refused or could not be reached (the session ended).

        A message the flow raises an error for is bad input, not a failed batch: it goes to the
        failure stream with its reason, once (keyed by its uplink position, so a master that
        dies here and its successor record it once between them); the flow, which holds part
        of it, is dropped (after the step in flight settled, so the reload includes it) and the
        step is built again without it. The step still moves the mark past it."""
        while True:
            try:
                flow = self.load()
                with self.phases.timed("graph"):
                    step = flow.run(fresh, now(), self.epoch, mark)
                return flow, step, fresh
            except MessageRefused as bad:
                if not writing.settle():
                    return None
                self.drop()
                if not self._record_failure(out, bad.msg, bad.reason):
                    return None
                fresh = [m for m in fresh if m is not bad.msg]
            except (Fenced, RedisUnavailable) as exc:  # a "processing" entry was refused or not written
                self._refuse(out, exc)
                return None

    def _isolate(self, out: Outcome, msgs: list[Message], now: Callable[[], float],
                 exc: BaseException) -> int | None:
        """A step of ``msgs`` could not be written (``exc``): run them one per step until the one
        that cannot be written, which goes to the failure stream with its reason (its position
        is then handled; the next step moves the mark past it). Returns how many of ``msgs``
        are handled, or None when Redis refused a step (the session ended). One message per
        step costs a round trip each, and only on this path."""
        for i, m in enumerate(msgs):
            try:
                if self._run_steps(out, [m], m.position, False, now) is not None:
                    return None
            except _GuessRefused:
                return i  # another writer moved the state: the caller carries on from Redis's view
            except _Unwritable as bad:
                reason = f"a value of this message cannot be written to Redis: {type(bad.exc).__name__}: {bad.exc}"
                if not self._record_failure(out, m, reason[:500]):
                    return None
                return i + 1
        log.warning("a step of %d messages could not be written (%r), but each alone could", len(msgs), exc)
        return len(msgs)

    def _record_failure(self, out: Outcome, m: Message, reason: str) -> bool:
        """Put ``m`` on the failure stream (once per uplink position): False when Redis could not
        be reached (the session ended)."""
        log.error("message %r at %s leaves through the failure stream: %s", m.id, m.position, reason)
        try:
            record_bad(self.store, self.spec, [(m.position, reason, m.body, len(m.body or b""))],
                       deadline_s=self.spec.write_lease)
        except RedisUnavailable as exc:
            self._refuse(out, exc)
            return False
        out.failed += 1
        return True


class _Unwritable(RuntimeError):
    """A step could not be written (UNWRITABLE) after the first ``sent`` messages committed."""

    def __init__(self, sent: int, exc: BaseException):
        super().__init__(f"a step could not be written after {sent} messages: {exc!r}")
        self.sent, self.exc = sent, exc


class _GuessRefused(RuntimeError):
    """A guarded step was refused; the first ``sent`` messages of the batch are committed."""

    def __init__(self, sent: int):
        super().__init__(f"guess refused after {sent} messages")
        self.sent = sent


class _NotSent(RuntimeError):
    """A step was not sent: the one before it in flight did not commit."""


class _InFlight:
    """The steps of a batch whose COMMITs may be in Redis (oldest first, at most ``depth``),
    and what follows from their answers."""

    def __init__(self, session: MasterSession, out: Outcome):
        self.session, self.out = session, out
        self.depth = 1 if session.guarded else STEPS_IN_FLIGHT
        self.sent = 0  # messages of the batch whose step committed
        self._steps: deque[tuple] = deque()

    def send(self, flow: MasterFlow, step: Step, guess: bool, chunk: list[Message], fresh: list[Message]) -> None:
        before = self._steps[-1] if self._steps else None
        # The mark Redis holds once the steps in flight commit: the flow's moves only at a commit.
        mark = flow.mark
        for _, _, pending, _, _ in self._steps:
            if pending.mark and (mark is None or position_order(pending.mark) > position_order(mark)):
                mark = pending.mark
        future = self.session._write(flow, step, guess, mark, after=before[0] if before else None)
        self._steps.append((future, flow, step, chunk, fresh))

    def make_room(self) -> bool:
        """Settle the oldest steps until another may be sent: False when one was refused."""
        while len(self._steps) >= self.depth:
            if not self._settle_oldest():
                return False
        return True

    def settle(self) -> bool:
        """Wait for every step in flight: True when each committed (counted, its claims kept) or
        there was none; False when one was refused. GuessWrong (StaleState too) raises
        _GuessRefused."""
        while self._steps:
            if not self._settle_oldest():
                return False
        return True

    def _settle_oldest(self) -> bool:
        future, flow, step, chunk, fresh = self._steps.popleft()
        session = self.session
        try:
            with session.phases.timed("commit"):
                future.result()
        except GuessWrong:
            self._never_sent()
            session.drop()
            raise _GuessRefused(self.sent) from None
        except (Fenced, RedisUnavailable) as exc:
            self._never_sent()
            session._refuse(self.out, exc)
            return False
        except UNWRITABLE as exc:
            self._never_sent()
            session.drop()
            raise _Unwritable(self.sent, exc) from exc
        except BaseException:
            self._never_sent()
            session.drop()
            raise
        flow.committed(step)
        self.out.committed(chunk, fresh, escalate=session.spec.pair is not None)
        self.sent += len(chunk)
        return True

    def _never_sent(self) -> None:
        """The oldest step did not commit: the ones behind it are not sent (each waits for it
        and raises _NotSent); wait for that, so no writer still holds one."""
        while self._steps:
            try:
                self._steps.popleft()[0].result()
            except _NotSent:
                continue
            raise RuntimeError("a step was sent although the one before it did not commit")

    def abandon(self) -> None:
        """The batch is failing: the flow goes, a write in flight is still waited for and,
        if it committed, counted (what it committed is processed whatever happens next)."""
        self.session.drop()
        try:
            self.settle()
        except Exception:  # noqa: BLE001 - the batch's own error is the one to raise
            pass
