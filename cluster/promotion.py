"""Taking and leaving the master role: fence, catch up, roll the bake back.

Under failure (promises 1, 2): the new master raises the fencing epoch in
Redis (a durable write on ``cluster.wait_replicas`` replicas,
``runtime/store/durable.py``), then delivers every uplink entry after the
processed mark up to where it has read itself (a worker reading behind: up
to the uplink's newest entry), re-read from the uplink; its bake is dropped
only once that succeeded. Any error leaves everything in Redis, and the election demotes the member and
queues it again.

What it records: the ``promoted`` event carries, beside where the time went, when each phase
ended on the flow's clock (``session_expired_at``: the election granted the lock;
``promoted_at``: the fence raised; ``state_loaded_at``; ``rolled_back_at``: the catch-up
done) and the master ZooKeeper named before (``old_master``). The clock is read between
the phases, never waited on; the old master's last sign of life is looked up later, off this
path (``member_events.py``), and the term's first write is logged by ``master_side.py``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..runtime.positions import position_order
from .roles import MASTER, WORKER
from .uplink_rows import record_bad

if TYPE_CHECKING:
    from .member import FlowMember

log = logging.getLogger("twinflow.peer")


class _StepDown(RuntimeError):
    """The member stopped being master while it was catching up on promotion."""


class Promotion:
    """A member's promotion and demotion, as the election calls them (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member

    def may_contend(self) -> bool:
        """Queue for the election only once the stream is warm and Redis answers."""
        m = self.m
        return m.state.streaming and not m.stopping.is_set() and m.store.ping()

    def on_promoted(self, epoch: int) -> None:
        """Take the master role: fence, then deliver what the old master left (see module doc).

        Raises when that fails; the election demotes the member and queues it again.
        """
        m = self.m
        began = time.monotonic()
        elected_at, old_master = m.leadership.elected_at, m.leadership.previous_master
        if not m.batch_lock.acquire(timeout=max(5.0, 5 * m.lease_s)):
            raise RuntimeError("a batch in flight did not finish (waiting for Redis?); not taking the role")
        took = {"batch_wait_s": time.monotonic() - began}  # where a promotion's time goes, for its log line
        try:
            # Durable, as a COMMIT is (runtime/store/durable.py): a fence a failover
            # takes back would let the old master write again. Else this raises and the election
            # demotes the member and queues it again.
            in_force = m.store.raise_epoch(epoch, deadline_s=m.lease_s, replicas=m.spec.wait_replicas,
                                           replica_wait_ms=m.spec.replica_wait_ms)
            if in_force > epoch:
                # Redis has seen a newer epoch than ZooKeeper just gave us (ZooKeeper
                # was reset?): our writes would all be refused. Stay a worker.
                m.event(logging.ERROR, "promotion_refused",
                        "epoch %d from ZooKeeper is older than %d in Redis; not taking the master role",
                        epoch, in_force, epoch=epoch, newest=in_force)
                m.leadership.step_down("stale epoch")
                return
            took["epoch_s"] = time.monotonic() - began - sum(took.values())
            promoted_at = m.clock.now()
            session = m.master.begin_term(epoch)  # a session on the state the old master committed
            took["state_load_s"] = time.monotonic() - began - sum(took.values())
            state_loaded_at = m.clock.now()
            warm = session.state_loads == 0  # the worker's warm copy, not a whole read (warm_state.py)
            m.state.become(MASTER, epoch)
            m.reader.pace()
            rolled = self.catch_up(epoch)
            took["catch_up_s"] = time.monotonic() - began - sum(took.values())
            m.claims.roll_back(rolled)  # every baked message was in the range just delivered
            rolled_back_at = m.clock.now()
            m.master.watch_first_write(epoch, promoted_at)  # the catch-up's writes are the rollback's
            m.reader.update_hold()
        except BaseException:
            m.state.become(WORKER)
            m.master.end_term()
            raise
        finally:
            m.batch_lock.release()
        phases = {"session_expired_at": elected_at, "promoted_at": promoted_at, "state_loaded_at": state_loaded_at,
                  "rolled_back_at": rolled_back_at}
        m.event(logging.INFO, "promoted", "%s is master at epoch %d (state: %s); delivered %d messages the "
                "old master had not", m.cfg.peer_id, epoch, "warm copy" if warm else "read whole", rolled,
                epoch=epoch, rolled_back=rolled, warm_state=warm, **{k: round(v, 3) for k, v in took.items()},
                old_master=old_master, **{k: round(v, 3) for k, v in phases.items() if v is not None})
        m.wake.set()  # the timers write its record now, while the old master's status is still in Redis
        if rolled:  # its own line, so that rollbacks can be counted and alerted on by name
            m.event(logging.WARNING, "rolled_back", "%s rolled back %d messages at epoch %d",
                    m.cfg.peer_id, rolled, epoch, epoch=epoch, count=rolled)

    def catch_up(self, epoch: int) -> int:
        """Deliver every uplink entry after the processed mark up to where this member has
        handled the uplink, re-read from Redis; returns how many were delivered now. A worker
        that read behind goes on to the uplink's newest entry: what it had not read yet is the
        master's to run now, and the first of it should not wait for a Spark batch (its reader
        then skips all of it, being at or before the mark)."""
        m = self.m
        store, spec = m.store, m.spec
        mark = store.processed_mark(deadline_s=m.lease_s)
        upto = m.state.handled_upto
        if m.cfg.worker_read_behind_ms > 0:
            newest = store.newest_position(deadline_s=m.lease_s)
            if newest is not None and (upto is None or position_order(newest) > position_order(upto)):
                upto = newest
        if upto is None or (mark is not None and position_order(upto) <= position_order(mark)):
            return 0
        before = m.state["delivered"]
        after = mark
        while True:
            rows = store.read_uplink(after, upto, m.intake.max_read_size, spec.message.max_bytes,
                                     max_bytes=spec.batch_bytes, deadline_s=m.lease_s)
            if not rows:
                break
            msgs, bad = m.intake.decode(rows)
            record_bad(store, spec, bad, deadline_s=m.lease_s)
            after = rows[-1][0]
            if m.master.run(msgs, epoch, after) is not None:
                raise _StepDown(f"stopped being master at epoch {epoch} during catch-up")
            if after == upto:
                break
        return m.state["delivered"] - before

    def on_demoted(self, reason: str) -> None:
        m = self.m
        m.state.become(WORKER)
        m.master.end_term()
        # The epoch of the term that ended: the election's, also when on_promoted failed before taking it.
        epoch = getattr(m.leadership, "epoch", 0) or m.state.epoch
        routine = reason in ("handover", "stopping")
        m.event(logging.INFO if routine else logging.WARNING, "demoted", "%s demoted (%s), epoch %d",
                m.cfg.peer_id, reason, epoch, epoch=epoch, reason=reason)
