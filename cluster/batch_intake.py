"""Batches from the uplink into a member: run as master, run ahead, baked as worker.

Under failure (promise 1, no loss): a batch is either processed whole
(delivered, baked or sent to the failure stream) or ``on_batch`` raises, so
Spark does not commit it and reads it again. A master's batch may run ahead
of Spark only once ``handled_id`` in Redis covers it (on the replicas
``wait_replicas`` asks for, as a worker's does once it baked a batch); if it
then fails, the next batch raises and the peer stops with exit code 1. A
batch held while ZooKeeper is suspended waits for the connection or the
session's loss; it is never dropped.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING

from ..runtime.message import Message
from ..runtime.store.store_errors import RedisUnavailable
from ..runtime.spark.logged_batch import delivered_read_s
from .batch_phases import NO_PHASES, BatchLog, BatchPhases
from .master_flow import collector_paused
from .roles import MASTER, WORKER
from .timings import BatchTimings
from .uplink_rows import decode_rows, last_position, record_bad

if TYPE_CHECKING:
    from .member import FlowMember
    from .shard_task import ShardResult

log = logging.getLogger("twinflow.peer")


class PeerStopping(RuntimeError):
    """A batch reached the peer while it stops: raised so that Spark does not commit it."""


class BatchIntake:
    """How a member takes a batch from the uplink (see the module doc)."""

    def __init__(self, member: "FlowMember", ahead: Executor | None):
        self.m = member
        spec = member.spec
        self.ahead = ahead  # where a master's batch runs ahead of Spark (or None)
        self._ahead: Future | None = None  # the batch running ahead, if any
        self.batch_error: BaseException | None = None  # why a batch that ran ahead failed
        # A batch never takes the bake past max_pending: the reader takes at
        # most max_read_size entries (read_size under light load, growing under
        # a backlog; a quarter of max_pending at most, so that the bake can
        # hold a few big batches), and holds while the next batch might not fit.
        self.read_size = min(spec.batch_size, spec.max_pending)
        self.max_read_size = min(spec.max_batch_size, max(self.read_size, spec.max_pending // 4))
        self.holding = False  # a master batch waits for ZooKeeper to come back
        self.batch_timings = BatchTimings((MASTER, WORKER))  # batch durations by role
        self.task_pid = 0     # the process that ran this shard's last batch (a sharded flow's executor)
        self.state_loads = 0  # whole-state loads executors made for this shard's batches
        # The last batch this member ran as master or baked as worker: (flow time it ended,
        # entries in it, seconds it took), for status; None before the first.
        self.last_batch: tuple[float, int, float] | None = None
        self.batch_log = BatchLog(member.cfg.batch_log)  # where each master batch's phases go, if anywhere

    # -- batches from the uplink ------------------------------------------
    def on_batch(self, batch_id: int, rows: list[tuple[str, bytes | None, int | None]]) -> None:
        """Process one batch whole, or raise so that Spark does not commit it; a master's batch
        may run ahead instead (module doc)."""
        phases = self.batch_log.begin(batch_id, delivered_read_s())
        with phases.timed("wait_previous"):
            self.settle_ahead()
        handed = False
        lock = self.m.batch_lock
        lock.acquire()
        try:
            last = last_position(rows)
            with phases.timed("handled"):
                ahead = self._may_run_ahead(last)
            if ahead:
                self._ahead = self.ahead.submit(self._run_ahead, batch_id, rows, last, phases)
                handed = True  # the batch thread releases batch_lock
                return
            self._decode_and_take(batch_id, rows, last, phases)
        finally:
            if not handed:
                lock.release()
            self.batch_log.handed_on()

    def _may_run_ahead(self, last: str | None) -> bool:
        """Whether this batch may run after on_batch returned (caller holds batch_lock): as master,
        once handled_id in Redis covers it; else it runs in on_batch."""
        m = self.m
        if self.ahead is None or last is None or m.stopping.is_set():
            return False
        if m.state.role != MASTER:
            return False
        try:  # on every replica asked for: a failover must not take it back (FlowStore.record_handled)
            m.store.record_handled(last, deadline_s=m.lease_s, replicas=m.spec.wait_replicas,
                                   replica_wait_ms=m.spec.replica_wait_ms)
        except RedisUnavailable:
            return False
        return True

    def _run_ahead(self, batch_id: int, rows: list[tuple], last: str, phases: BatchPhases) -> None:
        """The batch thread: the batch as on_batch would have run it (decoding too: Spark's
        thread goes back to Spark sooner), then batch_lock released."""
        m = self.m
        try:
            self._decode_and_take(batch_id, rows, last, phases)
        except PeerStopping as exc:  # handled_id covers it: a promoted member delivers it
            log.info("%s: %s", m.cfg.peer_id, exc)
        except BaseException as exc:
            self.batch_error = exc
            m.event(logging.ERROR, "batch_failed", "%s: batch %d failed after Spark committed it; stopping",
                    m.cfg.peer_id, batch_id, batch=batch_id, exc_info=True)
            raise
        finally:
            m.batch_lock.release()

    def _decode_and_take(self, batch_id: int, rows: list[tuple], last: str | None,
                         phases: BatchPhases = NO_PHASES) -> None:
        """Decode the rows and take the batch, Python's cyclic collector paused meanwhile.

        Why paused: a batch's messages live until it ends, so the collector's passes
        during it (one per 700 objects made) promote them and soon start full passes
        over the whole heap, to free nothing (a batch makes no reference cycles: its
        objects go when their last reference does). Measured on the master under a
        burst of 50,000: 0.28 s of every 1.2 s batch in collections, most of them
        full (docs/performance.md, "Per-peer costs"). It runs again once the batch is over.
        """
        self.batch_log.taken(phases, len(rows))
        as_master = False
        try:
            with collector_paused():
                with phases.timed("decode"):
                    msgs, bad = self.decode(rows)
                as_master = self._take_batch(batch_id, msgs, bad, last, phases)
        finally:
            if as_master:
                self.batch_log.done(phases)
            else:
                self.batch_log.skipped()

    def settle_ahead(self, timeout_s: float | None = None) -> None:
        """Wait for the batch running ahead; raise what it raised."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.result(timeout_s)

    def _take_batch(self, batch_id: int, msgs: list[Message], bad: list[tuple], last: str | None,
                    phases: BatchPhases = NO_PHASES) -> bool:
        """Record the bad entries, then bake or run the batch (caller holds batch_lock); True when
        it ran as master to its end."""
        m = self.m
        if m.stopping.is_set():
            raise PeerStopping(f"batch {batch_id} arrived while stopping; it is read again on restart")
        started, role = time.perf_counter(), m.state.role  # wall time, also under a simulator's clock
        m.state.count(read=len(msgs) + len(bad))
        if bad:
            record_bad(m.store, m.spec, bad)
            m.state.count(failed=len(bad))
        if last is None:
            return False
        try:
            as_master = self._process(batch_id, msgs, last, phases)
        finally:
            self.holding = False
            took = time.perf_counter() - started
            self.batch_timings.observe(role, took)
        # Only a batch taken whole (committed as master, or baked): one tuple a batch, for status.
        self.last_batch = (m.clock.now(), len(msgs) + len(bad), took)
        return as_master

    def _process(self, batch_id: int, msgs: list[Message], last: str, phases: BatchPhases = NO_PHASES) -> bool:
        """Run the batch as master or bake it: True when it ran as master to its end."""
        m = self.m
        while True:
            if m.stopping.is_set():
                raise PeerStopping(f"batch {batch_id} held while stopping; it is read again on restart")
            role, epoch = m.state.role_and_epoch()
            if role != MASTER:
                m.claims.bake(msgs, last)
                return False
            if m.leadership.may_write():
                rest = m.master.run(msgs, epoch, last, phases)
                if rest is None:
                    m.state.handled(last)
                    return True
                # stepped down part-way: the rest is a worker's
                m.claims.bake(rest, last)
                return False
            # Master but ZooKeeper is suspended: hold the batch until the
            # connection is back (keep the role) or the session is lost (bake).
            self.holding = True
            m.pause(0.05)

    # -- batches run on an executor (a sharded flow, see shard_reading) ------
    def executor_role(self) -> tuple[str, int]:
        """What an executor may do with this shard's next batch (caller holds batch_lock): run it as
        master at the epoch, bake-check it as worker, or hand it back ("driver": starting, or a
        master whose ZooKeeper connection is suspended, which must hold it here)."""
        role, epoch = self.m.state.role_and_epoch()
        if role == MASTER and self.m.leadership.may_write():
            return MASTER, epoch
        return (WORKER, 0) if role == WORKER else ("driver", 0)

    def take_result(self, batch_id: int, r: "ShardResult") -> None:
        """Finish a batch an executor ran for this shard (caller holds batch_lock): count it, send
        its claims, step down if its writes were refused, bake what it could not commit."""
        m = self.m
        if r.warm:
            self.warmed()
        self.task_pid = r.pid
        self.state_loads += r.state_loads
        if m.stopping.is_set():
            raise PeerStopping(f"batch {batch_id} finished while stopping; it is read again on restart")
        # Handed back to the driver, the good rows are counted by _take_batch here.
        m.state.count(failed=r.failed, delivered=r.delivered, skipped=r.skipped,
                      read=r.read if r.role in (MASTER, WORKER) else r.failed)
        m.master.count_left(r.left)
        if r.last is None:
            return
        if r.role == WORKER:
            m.claims.offer(r.msgs, r.done, r.last)
            return
        if r.role != MASTER:  # bad entries: recorded by the executor already
            self._take_batch(batch_id, self.decode(r.rows)[0], [], r.last)
            return
        m.master.took_executor_batch(r)
        if r.msgs:  # not committed: a worker's now
            m.claims.bake(r.msgs, r.last)
        else:
            m.state.handled(r.last)
        m.wake.set()

    def decode(self, rows) -> tuple[list[Message], list[tuple]]:
        """Messages, and (position, reason, body, size) of the entries that are bad."""
        msgs, bad, warm = decode_rows(rows, self.m.spec.message)
        if warm:
            self.warmed()
        return msgs, bad

    def warmed(self) -> None:
        """The query's first batch has run: from now on it reads at speed."""
        m = self.m
        if m.state.start_streaming():
            m.health.streaming(True)
            m.event(logging.INFO, "streaming", "%s is streaming", m.cfg.peer_id)
