"""The master's batch loop: a batch run through the flow in fenced COMMIT steps.

One loop for every place a master runs a batch: a node's driver
(``node.FlowNode``), a promoted worker's catch-up, and an executor running
one uplink shard's partition (``shard_task``). What differs between them
(how the role is known, what a refused write does, where escalations go)
is the :class:`MasterSide` the caller passes.

Promises (DESIGN.md promise 1): a message is run through the flow only if
it is not processed (not at or before the processed mark, ID not in the ID
cache, not a repeat inside the batch), and it counts as processed once the
COMMIT of its step succeeded. With a flow loaded the loop guesses which
messages are new from the mark the flow holds, and each COMMIT applies only
if the guess was right; a wrong guess (a message re-published with an ID
the flow processed) writes nothing, and the rest of the batch runs again
after asking Redis. Every step also names the state version it was built
from (``MasterFlow.version``), and Redis applies it only on that version: a
step built on state another writer has moved since (a second attempt of a
shard task, another process that ran the shard's last batch, a flow reloaded
while a step was in flight) writes nothing, and the loop builds it again on
the state Redis holds. A COMMIT that fails or is refused ends the loop at that
step: the messages from there on are returned uncommitted.

Bad input is data, never a failed batch: a message the flow raises an error
for (``MasterFlow.run`` raises MessageRefused), or whose step redis-py cannot
encode (found by running the failing step's messages one per step), goes to
the failure stream with its reason, keyed by its uplink position, and the
batch goes on without it.

Overlap: while one step's COMMIT is in Redis (sent from a writer thread, see
:func:`write_pool`), the loop builds the next step on the flow. At most one
write is in flight, and the next is sent only after it succeeded, so steps
commit in order and a refused one is the last: the step built meanwhile is
dropped with the flow (it was never sent). Escalations and counts follow a
step's COMMIT, never its build. The failover simulator passes an executor
that runs each write in the caller's thread (``chaos/sim/parts.py``), so
virtual time stays deterministic.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Callable, Protocol

import redis

from ..runtime.cluster_spec import ClusterSpec
from ..runtime.message import Message
from ..runtime.store.flow_store import DELIVER_MAX_MESSAGES, Fenced, FlowStore, GuessWrong, RedisUnavailable, chunked
from ..runtime.store.step import Step
from .master_flow import MasterFlow, MessageRefused
from .uplink_rows import record_bad

log = logging.getLogger("twinflow.master")


class MasterSide(Protocol):
    """What the loop needs from whoever runs it as master."""

    store: FlowStore
    spec: ClusterSpec
    writes: Executor  # where COMMITs are sent from: write_pool(), or a simulator's inline one

    def still_master(self, epoch: int) -> bool: ...
    def processed(self, msgs: list[Message]) -> list[bool]: ...      # may raise RedisUnavailable
    def master_flow(self) -> MasterFlow: ...  # the flow to build on, loaded if need be; may raise RedisUnavailable
    def refused(self, exc: Fenced | RedisUnavailable) -> None: ...   # drop the flow; step down or report it
    def drop(self) -> None: ...                                      # drop the flow (it may be ahead of Redis)
    def committed_chunk(self, chunk: list[Message], fresh: list[Message]) -> None: ...


_pool: tuple[int, ThreadPoolExecutor] | None = None


def write_pool() -> Executor:
    """This process's writer threads (made again in a forked child, where threads do not follow)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="twinflow-commit"))
    return _pool[1]


def _write(side: MasterSide, epoch: int, flow: MasterFlow, step: Step, guess: bool) -> Future:
    """Send ``step``'s COMMIT at ``epoch`` within the write lease, guarded by the mark ``flow``
    holds now when ``guess``; the future raises what the store raises (Fenced, GuessWrong,
    RedisUnavailable)."""
    spec = side.spec
    return side.writes.submit(side.store.commit, epoch, step, deadline_s=spec.write_lease,
                              replicas=spec.wait_replicas, replica_wait_ms=spec.replica_wait_ms,
                              guess=(flow.mark,) if guess else None)


# How many times in a row a step may be refused as built on state behind Redis before the
# batch fails (and Spark runs the task again): each refusal means another writer committed,
# so a run that keeps losing is one that keeps others making progress.
MAX_ROUNDS = 64


class Contended(RuntimeError):
    """Every round of a batch or a timer step was refused as behind Redis (MAX_ROUNDS)."""


def commit_one(side: MasterSide, epoch: int, make_step: Callable[[MasterFlow], Step], guess: bool) -> bool:
    """Build one step on the side's flow and COMMIT it (a timer's firing): False after a refused
    write (the side dropped the flow and acted on it). A step refused because the flow was
    behind Redis (GuessWrong, StaleState) is built again on the state Redis holds."""
    for _ in range(MAX_ROUNDS):
        try:
            flow = side.master_flow()
            step = make_step(flow)
            _write(side, epoch, flow, step, guess).result()
        except (Fenced, RedisUnavailable) as exc:
            side.refused(exc)
            return False
        except GuessWrong:
            side.drop()  # another writer moved the state: fire on what it left
            guess = False
            continue
        except BaseException:
            side.drop()
            raise
        flow.committed(step)
        return True
    raise Contended(f"a step was refused as behind Redis {MAX_ROUNDS} times in a row")


# What redis-py raises for a value it cannot send (a text no UTF-8 encoder takes, a value
# of a type it does not write): raised before anything is sent, so nothing was written.
UNWRITABLE = (UnicodeError, redis.DataError)


class _Unwritable(RuntimeError):
    """A step could not be written (UNWRITABLE) after the first ``sent`` messages committed."""

    def __init__(self, sent: int, exc: BaseException):
        super().__init__(f"a step could not be written after {sent} messages: {exc!r}")
        self.sent, self.exc = sent, exc


class _GuessedWrong(RuntimeError):
    """A guarded step was refused; the first ``sent`` messages of the batch are committed."""

    def __init__(self, sent: int):
        super().__init__(f"guess refused after {sent} messages")
        self.sent = sent


class _InFlight:
    """The one step of a batch whose COMMIT may be in Redis, and what follows from its answer."""

    def __init__(self, side: MasterSide):
        self.side = side
        self.sent = 0  # messages of the batch whose step committed
        self._step: tuple | None = None

    def send(self, epoch: int, flow: MasterFlow, step: Step, guess: bool, chunk: list[Message],
             fresh: list[Message]) -> None:
        self._step = (_write(self.side, epoch, flow, step, guess), flow, step, chunk, fresh)

    def settle(self) -> bool:
        """Wait for the step in flight, if any: True when it committed (counted, escalated) or
        there was none; False when it was refused. GuessWrong (StaleState too) raises _GuessedWrong."""
        if self._step is None:
            return True
        future, flow, step, chunk, fresh = self._step
        self._step = None
        try:
            future.result()
        except GuessWrong:
            self.side.drop()
            raise _GuessedWrong(self.sent) from None
        except (Fenced, RedisUnavailable) as exc:
            self.side.refused(exc)
            return False
        except UNWRITABLE as exc:
            self.side.drop()
            raise _Unwritable(self.sent, exc) from exc
        except BaseException:
            self.side.drop()
            raise
        flow.committed(step)
        self.side.committed_chunk(chunk, fresh)
        self.sent += len(chunk)
        return True

    def abandon(self) -> None:
        """The loop is failing: the flow goes, a write in flight is still waited for and,
        if it committed, counted (what it committed is processed whatever happens next)."""
        self.side.drop()
        try:
            self.settle()
        except Exception:  # noqa: BLE001 - the loop's own error is the one to raise
            pass


def run_master_batch(side: MasterSide, msgs: list[Message], epoch: int, last: str,
                     flow: MasterFlow | None, now: Callable[[], float]) -> list[Message] | None:
    """Run ``msgs`` (ending at uplink position ``last``) as master at ``epoch``: None when all
    was committed, else the uncommitted rest. ``flow``: the loaded flow to guess from, or None
    to ask Redis which messages are processed first."""
    sent, rounds = 0, 0
    while True:
        try:
            return _run_steps(side, msgs[sent:], epoch, last, flow, now)
        except _GuessedWrong as wrong:
            # A message processed before, or another writer (a second attempt of a shard
            # task, a process that ran this shard's last batch) committed since the flow
            # was loaded: ask Redis which of the rest are processed and build on its state.
            log.info("a step was built on state behind Redis; running the rest of the batch again from Redis's view")
            sent += wrong.sent
            rounds += 1
            if rounds >= MAX_ROUNDS:
                raise Contended(f"a batch's steps were refused as behind Redis {MAX_ROUNDS} times in a row") from None
        except _Unwritable as bad:
            sent += bad.sent
            handled = _isolate(side, msgs[sent:sent + DELIVER_MAX_MESSAGES], epoch, now, bad.exc)
            if handled is None:
                return msgs[sent:]
            sent += handled
        flow = None


def _isolate(side: MasterSide, msgs: list[Message], epoch: int, now: Callable[[], float],
             exc: BaseException) -> int | None:
    """A step of ``msgs`` could not be written (``exc``): run them one per step until the one
    that cannot be written, which goes to the failure stream with its reason (its position
    is then handled; the next step moves the mark past it). Returns how many of ``msgs``
    are handled, or None when Redis refused a step (the side acted on it). One message per
    step costs a round trip each, and only on this path."""
    for i, m in enumerate(msgs):
        try:
            if _run_steps(side, [m], epoch, m.position, None, now) is not None:
                return None
        except _GuessedWrong:
            return i  # another writer moved the state: the caller carries on from Redis's view
        except _Unwritable as bad:
            reason = f"a value of this message cannot be written to Redis: {type(bad.exc).__name__}: {bad.exc}"[:500]
            if not _record_failure(side, m, reason):
                return None
            return i + 1
    log.warning("a step of %d messages could not be written (%r), but each alone could", len(msgs), exc)
    return len(msgs)


def _record_failure(side: MasterSide, m: Message, reason: str) -> bool:
    """Put ``m`` on the failure stream (once per uplink position): False when Redis could not
    be reached (the side acted on it)."""
    log.error("message %r at %s leaves through the failure stream: %s", m.id, m.position, reason)
    try:
        record_bad(side.store, side.spec, [(m.position, reason, m.body, len(m.body or b""))],
                   deadline_s=side.spec.write_lease)
    except RedisUnavailable as exc:
        side.refused(exc)
        return False
    return True


def _run_steps(side: MasterSide, msgs: list[Message], epoch: int, last: str,
               guess_from: MasterFlow | None, now: Callable[[], float]) -> list[Message] | None:
    guess = guess_from is not None
    if guess:
        done = [guess_from.is_processed(m) for m in msgs]
    else:
        try:  # already processed (or a repeat inside this batch): never run through the graph again
            done = side.processed(msgs)
        except RedisUnavailable as exc:
            side.refused(exc)
            return msgs
        except UNWRITABLE as exc:  # an ID no key can be made of
            raise _Unwritable(0, exc) from exc
    seen: set[str] = set()
    run = []
    for m, d in zip(msgs, done):
        run.append(not d and m.id not in seen)
        seen.add(m.id)
    at = 0  # where the next chunk starts
    chunks = list(chunked(msgs)) or [[]]
    writing = _InFlight(side)
    whole = False  # every chunk's step was sent
    try:
        for i, chunk in enumerate(chunks):
            if not side.still_master(epoch):
                break
            fresh = [m for m, r in zip(chunk, run[at:at + len(chunk)]) if r]
            at += len(chunk)
            # The last chunk's step moves the mark past the whole batch (bad entries included).
            mark = last if i == len(chunks) - 1 else chunk[-1].position
            built = _build(side, writing, fresh, epoch, mark, now)  # while the step before is in Redis
            if built is None or not writing.settle():
                break
            flow, step, fresh = built
            writing.send(epoch, flow, step, guess, chunk, fresh)
        else:
            whole = True
        whole = writing.settle() and whole
    except (_GuessedWrong, _Unwritable):
        raise
    except BaseException:
        writing.abandon()
        raise
    return None if whole else msgs[writing.sent:]


def _build(side: MasterSide, writing: _InFlight, fresh: list[Message], epoch: int, mark: str,
           now: Callable[[], float]) -> tuple[MasterFlow, Step, list[Message]] | None:
    """Build the step that runs ``fresh`` on the side's flow: (flow, step, the messages it
    runs), or None when Redis refused or could not be reached (the side acted on it).

    A message the flow raises an error for is bad input, not a failed batch: it goes to the
    failure stream with its reason, once (keyed by its uplink position, so a master that
    dies here and its successor record it once between them); the flow, which holds part
    of it, is dropped (after the step in flight settled, so the reload includes it) and the
    step is built again without it. The step still moves the mark past it."""
    while True:
        try:
            flow = side.master_flow()
            return flow, flow.run(fresh, now(), epoch, mark), fresh
        except MessageRefused as bad:
            if not writing.settle():
                return None
            side.drop()
            if not _record_failure(side, bad.msg, bad.reason):
                return None
            fresh = [m for m in fresh if m is not bad.msg]
        except RedisUnavailable as exc:
            side.refused(exc)
            return None
