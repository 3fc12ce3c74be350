"""How every call of a flow store reaches Redis: retried while Redis is unreachable or refuses
writes for now, with a deadline, moving to the flow's primary when it moved, the outage logged.

It holds :class:`RedisCalls`, the part of ``FlowStore`` (``flow_store.py``) that its other
methods call through (``_call``), and its health (``health``,
``silent_s``, ``ping``).

Under failure: when Redis is down, times out, is out of memory or read-only
(a replica after a failover), a call waits and retries with a bounded
back-off (logging what it waits for) until Redis answers, the store is
closed (:class:`StoreClosed`) or the call's deadline passes
(:class:`RedisUnavailable`); it never drops a write silently. Every call
has a deadline: the caller's, else the store's ``call_deadline_s`` (300 s by
default, as the Spark reader's), so no thread waits for Redis for ever.
Where the flow's primary is can change: on a Redis Cluster a crashed
primary gives only connection errors until its replica takes over, so on a
connection error the store asks every cluster node it knows who owns the
flow's slot now and moves there (``redis_slot.relocate``); with Sentinel
the client asks the Sentinels for the primary as it reconnects. The first
call that fails logs the outage once (``redis_down``), the first answer
after it its end and length (``redis_back``), whichever thread sees them.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...logs import event
from ..waiting import retry
from .redis_slot import follow_moved, relocate
from .store_errors import RedisUnavailable, StoreClosed, transient
from . import scripts

log = logging.getLogger("twinflow.store")
T = TypeVar("T")

DEFAULT_CALL_DEADLINE_S = 300.0  # a call's deadline when its caller gives none (see module)


class RedisCalls:
    """The retrying calls of a :class:`~.flow_store.FlowStore`, whose ``__init__`` sets what
    they use (the client ``r``, ``keys``, ``peer_id``, the clock, the locks and the outage
    record)."""

    def _use(self, client: redis.Redis) -> None:
        # This store owns waiting and deadlines: redis-py's own retries (ten by
        # default in redis-py 8, with back-off) would stretch every deadline.
        client.set_retry(Retry(NoBackoff(), 0))
        self.r = client
        self._scripts = scripts.register(client)

    def close(self) -> None:
        self._closed.set()

    # -- retry ------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """``fn()``, retried while Redis is unreachable or refuses writes for now.

        ``deadline_s`` None waits up to the store's ``call_deadline_s`` (or until
        closed); 0 tries once; otherwise RedisUnavailable once that many seconds
        have passed. A connection error makes the store look for the flow's
        primary again (see module) and, when it moved, try there at once.
        """
        if deadline_s is None:
            deadline_s = self.call_deadline_s

        def attempt() -> T:
            client = self.r
            try:
                try:
                    result = fn()
                except (redis.ConnectionError, redis.TimeoutError):
                    if not self._relocate(client):
                        raise
                    result = fn()  # the flow's primary is elsewhere now: once more, there
            except redis.exceptions.MovedError as moved:
                # The flow's slot has a new owner (a cluster failover or a reshard): go there.
                log.warning("Redis Cluster moved the flow's slot to %s:%s; reconnecting", moved.host, moved.port)
                self._use(follow_moved(self.r, moved))
                raise
            except redis.RedisError as exc:
                if transient(exc) and self.failing_since is None:
                    self._went_down(what, exc)
                raise
            self.last_ok = self._monotonic()
            if self.failing_since is not None:
                self._came_back()
            return result

        def before_pause(exc: BaseException, waited: float, pause: float) -> None:
            if self._closed.is_set():
                raise StoreClosed(what) from exc
            log.warning("Redis unavailable during %s (%s); retrying in %.2f s", what, exc, pause)

        return retry(attempt, retryable=lambda exc: isinstance(exc, redis.RedisError) and transient(exc),
                     deadline_s=deadline_s, give_up=lambda exc, waited: RedisUnavailable(what, waited, exc),
                     on_retry=before_pause, sleep=self._sleep, monotonic=self._monotonic)

    def _relocate(self, failed: redis.Redis) -> bool:
        """After ``failed`` gave a connection error: True when the store now uses a client on
        another node (the primary that serves the flow now), else False."""
        with self._relocating:
            if self.r is not failed:  # another thread moved the store already
                return True
            try:
                moved = relocate(failed)
            except redis.RedisError:
                return False
            if moved is failed:
                return False
            self._use(moved)
            return True

    def _went_down(self, what: str, exc: BaseException) -> None:
        with self._outage:
            if self.failing_since is not None:
                return
            self.failing_since = self._monotonic()
            self.outages += 1
        event(log, logging.WARNING, "redis_down", "Redis stopped answering (%s during %s)", exc, what,
              flow=self.keys.flow, peer=self.peer_id, epoch=self.epoch_seen or None, during=what, error=str(exc))

    def _came_back(self) -> None:
        with self._outage:
            since, self.failing_since = self.failing_since, None
        if since is not None:
            down = self._monotonic() - since
            event(log, logging.INFO, "redis_back", "Redis answers again after %.1f s", down,
                  flow=self.keys.flow, peer=self.peer_id, epoch=self.epoch_seen or None, seconds=round(down, 3))

    def health(self) -> str:
        """"ok", or "down <s>s" while calls to Redis fail (what ``twinflow status`` shows)."""
        since = self.failing_since
        return "ok" if since is None else f"down {self._monotonic() - since:.0f}s"

    def silent_s(self) -> float:
        """Seconds since a call last got an answer from Redis (on the store's clock)."""
        return self._monotonic() - self.last_ok

    def ping(self) -> bool:
        """One PING, no retry: whether Redis answers now."""
        try:
            self._call("ping", lambda: self.r.ping(), deadline_s=0)
            return True
        except (RedisUnavailable, redis.RedisError):
            return False
