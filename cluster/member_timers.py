"""A member's timers: bake expiry, the flow's deadlines, sweep, trim, status, lease, the warm copy,
the records of the events stream.

They run on their own thread, so they fire with no new input. Under
failure: a round never raises, each of its parts guarded on its own, and the
thread outlives a round that did (a timer must keep firing: a master whose
timers stopped would take batches but write no status and, once the batches
stop, fire no time-out); a master that has
not reached Redis for its write lease steps down; the trim skips a round
when ZooKeeper cannot list the live members; a master fires the deadlines in
the state it loaded, so the old master's pending time-outs fire too
(promise 4); the records queued for the events stream are written with one attempt
each round, and kept for the next when Redis does not take them (``member_events.py``).
One round is ``round()`` (``FlowMember.timer_round``): the failover simulator calls it
in its own steps, on its virtual clock, instead of the thread.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as PingTimeout
from typing import TYPE_CHECKING

from .master_side import BUSY_RETRY_S
from .membership import MembersUnknown
from .roles import MASTER, WORKER

if TYPE_CHECKING:
    from .member import FlowMember

log = logging.getLogger("twinflow.peer")


# How long the lease watch waits for its PING: one still stuck in reconnecting (packets dropped,
# the Sentinels asked in vain, redis-py's own retries) is no answer.
LEASE_PING_S = 0.5


class MemberTimers:
    """A member's timer rounds and lease watch (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member
        self._next_status = self._next_sweep = self._next_trim = float("-inf")

    def run(self) -> None:
        """The timer thread: a round (see ``round``), then wait for the next one or a wake-up.
        It starts the lease watch beside it (see ``run_lease_watch``)."""
        m = self.m
        threading.Thread(target=self.run_lease_watch, name="lease", daemon=True).start()
        while not m.stopping.is_set():
            try:
                wait = self.round()
            except Exception:  # round() never raises; if it did, the timers must go on all the same
                log.exception("timer round")
                wait = BUSY_RETRY_S
            if wait is None:
                return
            m.wake.wait(wait)
            m.wake.clear()

    def round(self) -> float | None:
        """Fire what is due now: bake expiry (worker), the flow's deadlines (master), the
        sweep, the status and epoch guard, the events stream's records, the lease check. Returns
        the seconds until the next round is due, or None once the member stops. Never raises: a
        timer must keep firing."""
        m = self.m
        cfg = m.cfg
        # Often enough that a healthy master's status writes keep its lease fresh.
        status_every = min(cfg.status_interval_s, m.lease_s / 3)
        now = m.clock.now()
        deadline = m.claims.due(now)
        try:
            master_deadline = m.master.fire_due(now)
            if master_deadline is not None and (deadline is None or master_deadline < deadline):
                deadline = master_deadline
            m.claims.surface()
            mono = m.monotonic()
            if mono >= self._next_sweep:
                self._next_sweep = mono + cfg.sweep_interval_s
                m.claims.sweep()
            if mono >= self._next_trim and m.state.role == MASTER:
                self._next_trim = mono + cfg.trim_interval_s
                self._trim()
            if mono >= self._next_status:
                self._next_status = mono + status_every
                m.guard_epoch(0, deadline_s=0)
                m.reader.set_suspended(m.store.suspensions(deadline_s=0))  # every peer stops reading
                status = m.status()
                if not m.stopping.is_set():  # a stopping member has dropped its status: write none after
                    m.store.write_status(status, ttl_s=max(5, int(4 * cfg.status_interval_s)))
            if m.warm is not None and m.state.role == WORKER:
                # Last: it may read the history whole (priming), and a Redis error ends the round.
                m.warm.follow(deadline_s=0)
        except Exception as exc:
            if m.stopping.is_set():
                return None
            log.warning("timer loop: %s: %s", type(exc).__name__, exc)
        # Each on its own: one that raises must neither end the round nor keep the others from running.
        for last in (m.events.flush, m.reader.pace, self.check_lease):
            try:
                last()
            except Exception as exc:
                log.warning("timer loop: %s: %s", type(exc).__name__, exc)
        wait = min(status_every, cfg.sweep_interval_s)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - m.clock.now()))
        return wait

    def run_lease_watch(self) -> None:
        """The lease thread: the lease check every quarter lease, its PING waited for at most
        LEASE_PING_S. A timer round can wait on Redis far longer than the lease (with packets
        dropped, each call's reconnection asks every Sentinel in turn, and redis-py retries), so a
        master cut from Redis must not depend on that round to step down."""
        m = self.m
        pings = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-ping")
        pending = None

        def ping_within() -> bool:
            nonlocal pending
            if pending is None or pending.done():  # never more than one PING waiting
                pending = pings.submit(m.store.ping)
            try:
                return pending.result(timeout=LEASE_PING_S)
            except PingTimeout:
                return False

        try:
            while not m.stopping.wait(m.lease_s / 4):
                try:
                    self.check_lease(ping_within)
                except Exception as exc:  # the watch must keep watching
                    log.warning("lease watch: %s: %s", type(exc).__name__, exc)
        finally:
            pings.shutdown(wait=False)

    def check_lease(self, ping=None) -> None:
        """A master that has not reached Redis for longer than its lease steps down. ``ping``:
        how to ask Redis once more (default: the store's PING, as long as it takes)."""
        m = self.m
        store, leadership = m.store, m.leadership
        if leadership is None or not leadership.is_master or store.silent_s() <= m.lease_s:
            return
        # A starved timer thread also looks silent: ask Redis once more first.
        if (ping or store.ping)():
            return
        silent = store.silent_s()
        if silent > m.lease_s and leadership.is_master:
            m.event(logging.ERROR, "lease_expired",
                    "%s: no answer from Redis for %.1f s, over the write lease (%.1f s): stepping down",
                    m.cfg.peer_id, silent, m.lease_s, seconds=round(silent, 3), lease=m.lease_s)
            m.master.step_down("Redis unreachable")

    def _trim(self) -> None:
        """As master, drop the uplink entries every live peer has read and the flow processed,
        once older than ``uplink.retention`` (one script; the live peers are ZooKeeper's members).
        When ZooKeeper cannot list them, nothing is trimmed: a live worker's read position
        must never be left out."""
        m = self.m
        m.audit.trim()  # the failed messages' audit too (audit_upkeep.py); never raises
        m.streams.trim()  # and the streams the flow writes, to their bounds (stream_upkeep.py); never raises
        try:
            live = set(m.leadership.members()) | {m.cfg.peer_id}
        except MembersUnknown as exc:
            log.info("%s trims nothing this round: %s", m.cfg.peer_id, exc)
            return
        n, kept = m.store.trim_uplink(live, m.spec.retention, m.clock.now())
        if n:
            log.info("%s trimmed %d uplink entries before %s", m.cfg.peer_id, n, kept)
