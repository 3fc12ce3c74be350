"""How every call of a flow store reaches Redis: retried while Redis is unreachable or refuses
writes for now, with a deadline, moving to the flow's primary when it moved, the outage logged.

It holds :class:`RedisCalls`, the part of ``FlowStore`` (``flow_store.py``) that its other
methods, and the store's other parts (the audit, notices, stream trims), call through
(:meth:`~RedisCalls.call`), and its health (``health``, ``silent_s``, ``ping``). Where the
primary is and what is retried are the one policy of ``redis_caller.py``; this module adds
the store's deadlines, its close and its outage log.

Under failure: when Redis is down, times out, is out of memory or read-only
(a replica after a failover), a call waits and retries with a bounded
back-off (logging what it waits for) until Redis answers, the store is
closed (:class:`StoreClosed`) or the call's deadline passes
(:class:`RedisUnavailable`); it never drops a write silently. Every call
has a deadline: the caller's, else the store's ``call_deadline_s`` (300 s by
default, as the Spark reader's), so no thread waits for Redis for ever.
Where the flow's primary is can change (``redis_caller.py``): after a
connection error the store looks for it again and, when it moved, tries
there at once. The first
call that fails logs the outage once (``redis_down``), the first answer
after it its end and length (``redis_back``), whichever thread sees them.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, TypeVar

import redis

from ...logs import event
from .redis_caller import RedisCaller
from .store_errors import RedisUnavailable, StoreClosed, transient
from . import scripts

log = logging.getLogger("twinflow.store")
T = TypeVar("T")

DEFAULT_CALL_DEADLINE_S = 300.0  # a call's deadline when its caller gives none (see module)


class RedisCalls:
    """The retrying calls of a :class:`~.flow_store.FlowStore`, whose ``__init__`` calls
    :meth:`_calls_through` and sets what they report with (``keys``, ``peer_id``)."""

    def _calls_through(self, client: redis.Redis, sleep: Callable[[float], None],
                       monotonic: Callable[[], float]) -> None:
        self._closed = threading.Event()
        self._monotonic = monotonic
        self.caller = RedisCaller(client=client, on_client=self._registered, again_at_once=True,
                                  sleep=sleep, monotonic=monotonic)
        self.last_ok = monotonic()  # when a call last got an answer from Redis
        self.failing_since: float | None = None  # when calls began to fail, while they fail
        self.outages = 0  # times calls began to fail (redis_down), for the metrics
        self._outage = threading.Lock()  # several threads call at once: one redis_down/redis_back line each

    def _registered(self, client: redis.Redis) -> None:
        self.scripts = scripts.register(client)  # each client its own: a script runs where it is registered

    @property
    def r(self) -> redis.Redis:
        """The client on the flow's primary now (it may change between calls: read it in each)."""
        return self.caller.client

    def close(self) -> None:
        self._closed.set()

    # -- retry ------------------------------------------------------------
    def call(self, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """``fn()`` (which reads :attr:`r` when it runs), retried while Redis is unreachable or
        refuses writes for now.

        ``deadline_s`` None waits up to the store's ``call_deadline_s`` (or until
        closed); 0 tries once; otherwise RedisUnavailable once that many seconds
        have passed.
        """
        def failed(exc: BaseException) -> None:
            if transient(exc) and self.failing_since is None:
                self._went_down(what, exc)

        def before_pause(exc: BaseException, waited: float, pause: float) -> None:
            if self._closed.is_set():
                raise StoreClosed(what) from exc
            log.warning("Redis unavailable during %s (%s); retrying in %.2f s", what, exc, pause)

        result = self.caller.call(lambda client: fn(), deadline_s=self.call_deadline_s if deadline_s is None
                                  else deadline_s, give_up=lambda exc, waited: RedisUnavailable(what, waited, exc),
                                  on_retry=before_pause, on_failure=failed)
        self.last_ok = self._monotonic()
        if self.failing_since is not None:
            self._came_back()
        return result

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
            self.call("ping", lambda: self.r.ping(), deadline_s=0)
            return True
        except (RedisUnavailable, redis.RedisError):
            return False
