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
from typing import TYPE_CHECKING

from ..runtime.message import Message

from ..runtime.positions import position_order
from ..runtime.store.store_errors import Fenced, RedisUnavailable
from .master_flow import collector_paused
from .roles import MASTER, WORKER
from .uplink_rows import decode_rows, last_position, processed_as_worker, record_bad

if TYPE_CHECKING:
    from .shard_task import ShardResult

log = logging.getLogger("twinflow.peer")


class PeerStopping(RuntimeError):
    """A batch reached the peer while it stops: raised so that Spark does not commit it."""


class BatchIntake:
    """How a member takes a batch (mixed into FlowMember)."""

    # -- batches from the uplink ------------------------------------------
    def on_batch(self, batch_id: int, rows: list[tuple[str, bytes | None, int | None]]) -> None:
        """Process one batch whole, or raise so that Spark does not commit it; a master's batch
        may run ahead instead (module doc, "Batches run ahead")."""
        self._settle_ahead()
        handed = False
        self.batch_lock.acquire()
        try:
            last = last_position(rows)
            if self._may_run_ahead(last):
                self._ahead = self.ahead.submit(self._run_ahead, batch_id, rows, last)
                handed = True  # the batch thread releases batch_lock
                return
            self._decode_and_take(batch_id, rows, last)
        finally:
            if not handed:
                self.batch_lock.release()

    def _may_run_ahead(self, last: str | None) -> bool:
        """Whether this batch may run after on_batch returned (caller holds batch_lock): as master,
        once handled_id in Redis covers it; else it runs here, as before."""
        if self.ahead is None or last is None or self._stop.is_set():
            return False
        with self._lock:
            if self.role != MASTER:
                return False
        try:  # on every replica asked for: a failover must not take it back (FlowStore.record_handled)
            self.store.record_handled(last, deadline_s=self.lease_s, replicas=self.spec.wait_replicas,
                                      replica_wait_ms=self.spec.replica_wait_ms)
        except RedisUnavailable:
            return False
        return True

    def _run_ahead(self, batch_id: int, rows: list[tuple], last: str) -> None:
        """The batch thread: the batch as on_batch would have run it (decoding too: Spark's
        thread goes back to Spark sooner), then batch_lock released."""
        try:
            self._decode_and_take(batch_id, rows, last)
        except PeerStopping as exc:  # handled_id covers it: a promoted member delivers it
            log.info("%s: %s", self.cfg.peer_id, exc)
        except BaseException as exc:
            self.batch_error = exc
            self._event(logging.ERROR, "batch_failed", "%s: batch %d failed after Spark committed it; stopping",
                        self.cfg.peer_id, batch_id, batch=batch_id, exc_info=True)
            raise
        finally:
            self.batch_lock.release()

    def _decode_and_take(self, batch_id: int, rows: list[tuple], last: str | None) -> None:
        """Decode the rows and take the batch, Python's cyclic collector paused meanwhile.

        Why paused: a batch's messages live until it ends, so the collector's passes
        during it (one per 700 objects made) promote them and soon start full passes
        over the whole heap, to free nothing (a batch makes no reference cycles: its
        objects go when their last reference does). Measured on the master under a
        burst of 50,000: 0.28 s of every 1.2 s batch in collections, most of them
        full (docs/performance.md). It runs again once the batch is over.
        """
        with collector_paused():
            msgs, bad = self._decode(rows)
            self._take_batch(batch_id, msgs, bad, last)

    def _settle_ahead(self, timeout_s: float | None = None) -> None:
        """Wait for the batch running ahead; raise what it raised."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.result(timeout_s)

    def _take_batch(self, batch_id: int, msgs: list[Message], bad: list[tuple], last: str | None) -> None:
        """Record the bad entries, then bake or run the batch (caller holds batch_lock)."""
        if self._stop.is_set():
            raise PeerStopping(f"batch {batch_id} arrived while stopping; it is read again on restart")
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

    # -- batches run on an executor (a sharded flow, see shard_reading) ------
    def executor_role(self) -> tuple[str, int]:
        """What an executor may do with this shard's next batch (caller holds batch_lock): run it as
        master at the epoch, bake-check it as worker, or hand it back ("driver": starting, or a
        master whose ZooKeeper connection is suspended, which must hold it here)."""
        with self._lock:
            role, epoch = self.role, self.epoch
        if role == MASTER and self.leadership.may_write():
            return MASTER, epoch
        return (WORKER, 0) if role == WORKER else ("driver", 0)

    def take_result(self, batch_id: int, r: "ShardResult") -> None:
        """Finish a batch an executor ran for this shard (caller holds batch_lock): count it, send
        its claims, step down if its writes were refused, bake what it could not commit."""
        if r.warm:
            self.warmed()
        self.task_pid = r.pid
        self.state_loads += r.state_loads
        if self._stop.is_set():
            raise PeerStopping(f"batch {batch_id} finished while stopping; it is read again on restart")
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
        if self.session is not None:
            self.session.drop()  # the executor committed: a flow here is behind Redis
        self.remote_deadline = r.next_deadline
        self.remote_batch_at = self.monotonic()
        if r.claims and self.spec.pair is not None:
            self.escalate(r.claims)
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
                raise PeerStopping(f"batch {batch_id} held while stopping; it is read again on restart")
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
            self.warmed()
        return msgs, bad

    def warmed(self) -> None:
        """The query's first batch has run: from now on it reads at speed."""
        if not self.streaming:
            self.streaming_since = time.time()
            self.streaming = True
            self.health.streaming(True)
            self._event(logging.INFO, "streaming", "%s is streaming", self.cfg.peer_id)

    def _handled(self, position: str) -> None:
        with self._lock:
            if self.handled_upto is None or position_order(position) > position_order(self.handled_upto):
                self.handled_upto = position

    def _bake(self, msgs: list[Message], last: str) -> None:
        """Bake as worker (caller holds batch_lock); records how far this member handled the uplink."""
        self._offer(*processed_as_worker(self.store, msgs, last, self.spec), last)

    def _offer(self, msgs: list[Message], done: list[bool], last: str) -> None:
        now = self.clock.now()
        with self._lock:
            for m, d in zip(msgs, done):
                self.sort.offer(m, now, processed=d)
        self._handled(last)
        self._update_backpressure()
        self._wake.set()
