"""A member's timers: bake expiry, the flow's deadlines, sweep, trim, status, lease, the warm copy.

They run on their own thread, so they fire with no new input. Under
failure: a round never raises (a timer must keep firing); a master that has
not reached Redis for its write lease steps down; the trim skips a round
when ZooKeeper cannot list the live members; a master fires the deadlines in
the state it loaded, so the old master's pending time-outs fire too
(promise 4). One round is ``timer_round()``: the failover simulator calls it
in its own steps, on its virtual clock, instead of the thread.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as PingTimeout

from ..runtime.store.flow_store import SURFACED
from .membership import MembersUnknown
from .roles import MASTER, WORKER

log = logging.getLogger("twinflow.peer")


# A sharded flow's master fires a time-out itself once this long has passed without a batch
# (whose executor would have fired it): the most a time-out waits for that under no load.
REMOTE_FIRE_AFTER_S = 0.25
BUSY_RETRY_S = 0.05  # how soon the timer looks again at a deadline a batch in progress holds up
# How long the lease watch waits for its PING: one still stuck in reconnecting (packets dropped,
# the Sentinels asked in vain, redis-py's own retries) is no answer.
LEASE_PING_S = 0.5


class MemberTimers:
    """A member's timer rounds (mixed into FlowMember)."""

    # -- timers -----------------------------------------------------------
    def run_timers(self) -> None:
        """The timer thread: a round (see ``timer_round``), then wait for the next one or a wake-up.
        It starts the lease watch beside it (see ``run_lease_watch``)."""
        threading.Thread(target=self.run_lease_watch, name="lease", daemon=True).start()
        while not self._stop.is_set():
            wait = self.timer_round()
            if wait is None:
                return
            self._wake.wait(wait)
            self._wake.clear()

    def timer_round(self) -> float | None:
        """Fire what is due now: bake expiry (worker), the flow's deadlines (master), the
        sweep, the status and epoch guard, the lease check. Returns the seconds until the
        next round is due, or None once the member stops. Never raises: a timer must keep firing."""
        # Often enough that a healthy master's status writes keep its lease fresh.
        status_every = min(self.cfg.status_interval_s, self.lease_s / 3)
        now = self.clock.now()
        with self._lock:
            if self.role != MASTER:
                self._to_surface.extend((m, SURFACED) for m in self.sort.tick(now))
            self._to_surface.extend(self.sort.resolved())  # how surfaced messages ended since
            deadline = self.sort.next_deadline()
            surface, self._to_surface = self._to_surface, []
        try:
            master_deadline = self._fire_due(now)
            if master_deadline is not None and (deadline is None or master_deadline < deadline):
                deadline = master_deadline
            if surface:
                fresh = [m for m, event in surface if event == SURFACED]
                if fresh:
                    log.warning("%d messages fully baked without a claim (first: %s)", len(fresh), fresh[0].id)
                try:
                    pair = self.spec.pair
                    self.store.surface_unclaimed(surface, pair.outlink_name(pair.unclaimed_outlink))
                except Exception:
                    with self._lock:  # surfaced on the next round instead; they are still held
                        self._to_surface[:0] = surface
                    raise
            mono = self.monotonic()
            if mono >= self._next_sweep:
                self._next_sweep = mono + self.cfg.sweep_interval_s
                self._sweep()
            if mono >= self._next_trim and self.role == MASTER:
                self._next_trim = mono + self.cfg.trim_interval_s
                self._trim()
            if mono >= self._next_status:
                self._next_status = mono + status_every
                self._guard_epoch(0, deadline_s=0)
                self.store.write_status(self.status(), ttl_s=max(5, int(4 * self.cfg.status_interval_s)))
            if self.warm is not None and self.role == WORKER:
                # Last: it may read the history whole (priming), and a Redis error ends the round.
                self.warm.follow(deadline_s=0)
        except Exception as exc:
            if self._stop.is_set():
                return None
            log.warning("timer loop: %s: %s", type(exc).__name__, exc)
        self._pace()
        self._check_lease()
        wait = min(status_every, self.cfg.sweep_interval_s)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - self.clock.now()))
        return wait

    def _fire_due(self, now: float) -> float | None:
        """As master, fire the flow's deadlines due at ``now`` and commit what they did;
        returns the next deadline. A batch in progress fires them itself, so this never waits
        for one; and the flow is only read holding the member (``batch_lock``), never while a batch
        builds a step on it or drops it."""
        if self.role != MASTER:
            return None
        if not self.batch_lock.acquire(blocking=False):
            # A batch holds the member and fires them itself (an executor's, before its batch);
            # look again shortly rather than spin on a deadline already past.
            return now + BUSY_RETRY_S
        try:
            flow = self.flow
            due = flow.next_deadline() if flow is not None else self.remote_deadline
            if due is None or due > now:
                return due
            if flow is None:
                # Executors run this shard's batches and fire what is due first, on a flow they
                # keep; firing here would load the whole state. Only when no batch came lately.
                quiet = self.monotonic() - self.remote_batch_at
                if quiet < REMOTE_FIRE_AFTER_S:
                    return now + REMOTE_FIRE_AFTER_S - quiet
            with self._lock:
                role = self.role
            if role == MASTER and self.leadership.may_write():  # a flow dropped is loaded again
                self.lateness.observe(max(0.0, now - due))  # once per firing round: the earliest due
                self._fire(now)
            flow = self.flow
            return flow.next_deadline() if flow is not None else None
        finally:
            self.batch_lock.release()

    def run_lease_watch(self) -> None:
        """The lease thread: the lease check every quarter lease, its PING waited for at most
        LEASE_PING_S. A timer round can wait on Redis far longer than the lease (with packets
        dropped, each call's reconnection asks every Sentinel in turn, and redis-py retries), so a
        master cut from Redis must not depend on that round to step down."""
        pings = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-ping")
        pending = None

        def ping_within() -> bool:
            nonlocal pending
            if pending is None or pending.done():  # never more than one PING waiting
                pending = pings.submit(self.store.ping)
            try:
                return pending.result(timeout=LEASE_PING_S)
            except PingTimeout:
                return False

        try:
            while not self._stop.wait(self.lease_s / 4):
                try:
                    self._check_lease(ping_within)
                except Exception as exc:  # the watch must keep watching
                    log.warning("lease watch: %s: %s", type(exc).__name__, exc)
        finally:
            pings.shutdown(wait=False)

    def _check_lease(self, ping=None) -> None:
        """A master that has not reached Redis for longer than its lease steps down. ``ping``:
        how to ask Redis once more (default: the store's PING, as long as it takes)."""
        if self.leadership is None or not self.leadership.is_master or self.store.silent_s() <= self.lease_s:
            return
        # A starved timer thread also looks silent: ask Redis once more first.
        if (ping or self.store.ping)():
            return
        silent = self.store.silent_s()
        if silent > self.lease_s and self.leadership.is_master:
            self._event(logging.ERROR, "lease_expired",
                        "%s: no answer from Redis for %.1f s, over the write lease (%.1f s): stepping down",
                        self.cfg.peer_id, silent, self.lease_s, seconds=round(silent, 3), lease=self.lease_s)
            self._step_down("Redis unreachable")

    def _sweep(self) -> None:
        """Release every held message at or before the processed mark (one Redis read)."""
        mark = self.store.processed_mark(deadline_s=0)
        if mark is None:
            return
        with self._lock:
            released = self.sort.release_upto(mark)
        if released:
            self._update_backpressure()

    def _trim(self) -> None:
        """As master, drop the uplink entries every live peer has read and the flow processed,
        once older than ``uplink.retention`` (one script; the live peers are ZooKeeper's members).
        When ZooKeeper cannot list them, nothing is trimmed: a live worker's read position
        must never be left out."""
        try:
            live = set(self.leadership.members()) | {self.cfg.peer_id}
        except MembersUnknown as exc:
            log.info("%s trims nothing this round: %s", self.cfg.peer_id, exc)
            return
        n, kept = self.store.trim_uplink(live, self.spec.retention, self.clock.now())
        if n:
            log.info("%s trimmed %d uplink entries before %s", self.cfg.peer_id, n, kept)
