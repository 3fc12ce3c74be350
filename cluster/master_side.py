"""A node as master: its flow, the steps it commits, and stepping down.

Under failure (promise 3): a write the fence refuses, or one that cannot
reach Redis within the write lease, makes the node step down; the flow is
dropped on any failed step, so the next step is built on the state Redis
holds (``master_steps``).
"""

from __future__ import annotations

import logging

from ..runtime.message import Message
from ..runtime.store.flow_store import Fenced, RedisUnavailable
from .master_flow import MasterFlow
from .master_steps import commit_one, run_master_batch
from .roles import MASTER, WORKER

log = logging.getLogger("twinflow.node")


class MasterSide:
    """A node's master side (mixed into FlowNode; master_steps calls it back)."""

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
