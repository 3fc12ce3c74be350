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
after asking Redis. A COMMIT that fails or is refused ends the loop at that
step: the messages from there on are returned uncommitted.
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol

from ..runtime.cluster_spec import ClusterSpec
from ..runtime.message import Message
from ..runtime.store.flow_store import FlowStore, GuessWrong, RedisUnavailable, chunked
from .master_flow import MasterFlow

log = logging.getLogger("twinflow.master")


class MasterSide(Protocol):
    """What the loop needs from whoever runs it as master."""

    def still_master(self, epoch: int) -> bool: ...
    def processed(self, msgs: list[Message]) -> list[bool]: ...      # may raise RedisUnavailable
    def commit(self, epoch: int, make_step: Callable, guess: bool) -> bool: ...  # False: stop; may raise GuessWrong
    def committed_chunk(self, chunk: list[Message], fresh: list[Message]) -> None: ...
    def unreachable(self, exc: RedisUnavailable) -> None: ...


def commit_step(store: FlowStore, flow: MasterFlow, spec: ClusterSpec, epoch: int, make_step: Callable,
                guess: bool) -> None:
    """Build a step on ``flow`` and COMMIT it at ``epoch`` within the write lease (guarded by the
    mark the flow holds with ``guess``), then record it on the flow. Raises what the store raises
    (Fenced, GuessWrong, RedisUnavailable); the caller then drops the flow."""
    step = make_step(flow)
    store.commit(epoch, step, deadline_s=spec.write_lease, replicas=spec.wait_replicas,
                 replica_wait_ms=spec.replica_wait_ms, guess=(flow.mark,) if guess else None)
    flow.committed(step)


class _GuessedWrong(RuntimeError):
    """A guarded step was refused; the first ``sent`` messages of the batch are committed."""

    def __init__(self, sent: int):
        super().__init__(f"guess refused after {sent} messages")
        self.sent = sent


def run_master_batch(side: MasterSide, msgs: list[Message], epoch: int, last: str,
                     flow: MasterFlow | None, now: Callable[[], float]) -> list[Message] | None:
    """Run ``msgs`` (ending at uplink position ``last``) as master at ``epoch``: None when all
    was committed, else the uncommitted rest. ``flow``: the loaded flow to guess from, or None
    to ask Redis which messages are processed first."""
    try:
        return _run_steps(side, msgs, epoch, last, flow, now)
    except _GuessedWrong as wrong:
        log.info("a batch held a message processed before; running it again from Redis's view")
        return _run_steps(side, msgs[wrong.sent:], epoch, last, None, now)


def _run_steps(side: MasterSide, msgs: list[Message], epoch: int, last: str,
               guess_from: MasterFlow | None, now: Callable[[], float]) -> list[Message] | None:
    guess = guess_from is not None
    if guess:
        done = [guess_from.is_processed(m) for m in msgs]
    else:
        try:  # already processed (or a repeat inside this batch): never run through the graph again
            done = side.processed(msgs)
        except RedisUnavailable as exc:
            side.unreachable(exc)
            return msgs
    seen: set[str] = set()
    run = []
    for m, d in zip(msgs, done):
        run.append(not d and m.id not in seen)
        seen.add(m.id)
    sent = 0
    chunks = list(chunked(msgs)) or [[]]
    for i, chunk in enumerate(chunks):
        if not side.still_master(epoch):
            return msgs[sent:]
        fresh = [m for m, r in zip(chunk, run[sent:sent + len(chunk)]) if r]
        # The last chunk's step moves the mark past the whole batch (bad entries included).
        mark = last if i == len(chunks) - 1 else chunk[-1].position
        try:
            if not side.commit(epoch, lambda flow: flow.run(fresh, now(), epoch, mark), guess):
                return msgs[sent:]
        except GuessWrong:
            raise _GuessedWrong(sent) from None
        side.committed_chunk(chunk, fresh)
        sent += len(chunk)
    return None
