"""Taking and leaving the master role: fence, catch up, roll the bake back.

Under failure (promises 1, 2): the new master raises the fencing epoch in
Redis (confirmed by ``WAIT`` with ``cluster.wait_replicas``), then delivers
every uplink entry after the processed mark up to where it has read itself
(a worker reading behind: up to the uplink's newest entry), re-read from the
uplink; its bake is dropped only once that succeeded. Any
error leaves everything in Redis, and the election demotes the member and
queues it again.
"""

from __future__ import annotations

import logging
import time

from ..runtime.positions import position_order
from .roles import MASTER, WORKER
from .uplink_rows import record_bad

log = logging.getLogger("twinflow.peer")


class _StepDown(RuntimeError):
    """The member stopped being master while it was catching up on promotion."""


class Promotion:
    """A member's promotion and demotion (mixed into FlowMember)."""

    # -- roles ------------------------------------------------------------
    def may_contend(self) -> bool:
        """Queue for the election only once the stream is warm and Redis answers."""
        return self.streaming and not self._stop.is_set() and self.store.ping()

    def on_promoted(self, epoch: int) -> None:
        """Take the master role: fence, then deliver what the old master left (see module doc).

        Raises when that fails; the election demotes the member and queues it again.
        """
        began = time.monotonic()
        if not self.batch_lock.acquire(timeout=max(5.0, 5 * self.lease_s)):
            raise RuntimeError("a batch in flight did not finish (waiting for Redis?); not taking the role")
        took = {"batch_wait_s": time.monotonic() - began}  # where a promotion's time goes, for its log line
        try:
            # Confirmed by WAIT with cluster.wait_replicas (as a COMMIT is): else this raises and
            # the election demotes the member and queues it again (issue 18, item 6).
            in_force = self.store.raise_epoch(epoch, deadline_s=self.lease_s, replicas=self.spec.wait_replicas,
                                              replica_wait_ms=self.spec.replica_wait_ms)
            if in_force > epoch:
                # Redis has seen a newer epoch than ZooKeeper just gave us (ZooKeeper
                # was reset?): our writes would all be refused. Stay a worker.
                self._event(logging.ERROR, "promotion_refused",
                            "epoch %d from ZooKeeper is older than %d in Redis; not taking the master role",
                            epoch, in_force, epoch=epoch, newest=in_force)
                self.leadership.step_down("stale epoch")
                return
            took["epoch_s"] = time.monotonic() - began - sum(took.values())
            session = self._begin_term(epoch)  # a session on the state the old master committed
            took["state_load_s"] = time.monotonic() - began - sum(took.values())
            warm = session.state_loads == 0  # the worker's warm copy, not a whole read (warm_state.py)
            self.remote_deadline = None
            with self._lock:
                self.epoch = epoch
                self.known_epoch = max(self.known_epoch, epoch)
                self.role = MASTER
            self._pace()
            rolled = self._catch_up(epoch)
            took["catch_up_s"] = time.monotonic() - began - sum(took.values())
            with self._lock:
                self.sort.rollback()  # every baked message was in the range just delivered
                self.rolled_back += rolled
            self._update_backpressure()
        except BaseException:
            with self._lock:
                self.role = WORKER
            self._end_term()
            raise
        finally:
            self.batch_lock.release()
        self._event(logging.INFO, "promoted", "%s is master at epoch %d (state: %s); delivered %d messages the "
                    "old master had not", self.cfg.peer_id, epoch, "warm copy" if warm else "read whole", rolled,
                    epoch=epoch, rolled_back=rolled, warm_state=warm,
                    **{k: round(v, 3) for k, v in took.items()})
        if rolled:  # its own line, so that rollbacks can be counted and alerted on by name
            self._event(logging.WARNING, "rolled_back", "%s rolled back %d messages at epoch %d",
                        self.cfg.peer_id, rolled, epoch, epoch=epoch, count=rolled)

    def _catch_up(self, epoch: int) -> int:
        """Deliver every uplink entry after the processed mark up to where this member has
        handled the uplink, re-read from Redis; returns how many were delivered now. A worker
        that read behind goes on to the uplink's newest entry: what it had not read yet is the
        master's to run now, and the first of it should not wait for a Spark batch (its reader
        then skips all of it, being at or before the mark)."""
        mark = self.store.processed_mark(deadline_s=self.lease_s)
        upto = self.handled_upto
        if self.cfg.worker_read_behind_ms > 0:
            newest = self.store.newest_position(deadline_s=self.lease_s)
            if newest is not None and (upto is None or position_order(newest) > position_order(upto)):
                upto = newest
        if upto is None or (mark is not None and position_order(upto) <= position_order(mark)):
            return 0
        before = self.delivered
        after = mark
        while True:
            rows = self.store.read_uplink(after, upto, self.max_read_size, self.spec.message.max_bytes,
                                          max_bytes=self.spec.batch_bytes, deadline_s=self.lease_s)
            if not rows:
                break
            msgs, bad = self._decode(rows)
            record_bad(self.store, self.spec, bad, deadline_s=self.lease_s)
            after = rows[-1][0]
            if self._run_master(msgs, epoch, after) is not None:
                raise _StepDown(f"stopped being master at epoch {epoch} during catch-up")
            if after == upto:
                break
        return self.delivered - before

    def on_demoted(self, reason: str) -> None:
        with self._lock:
            self.role = WORKER
        self._end_term()
        # The epoch of the term that ended: the election's, also when on_promoted failed before taking it.
        epoch = getattr(self.leadership, "epoch", 0) or self.epoch
        routine = reason in ("handover", "stopping")
        self._event(logging.INFO if routine else logging.WARNING, "demoted", "%s demoted (%s), epoch %d",
                    self.cfg.peer_id, reason, epoch, epoch=epoch, reason=reason)

    def handover(self, timeout_s: float) -> dict:
        if self.leadership is None:
            return {"ok": False, "reason": "member is not running"}
        return self.leadership.handover(timeout_s)
