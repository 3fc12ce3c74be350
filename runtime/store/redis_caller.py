"""The one way twinflow calls a flow's Redis: a client that follows the flow's primary, and one
retry policy for what Redis says while it cannot serve for now.

Every caller of a flow's Redis goes through a :class:`RedisCaller`: the flow store
(``redis_calls.py``, with its outage log and deadlines), the Spark source's reads
(``runtime/spark/source.py``), the flow clock's ``TIME`` samples (``cluster/flow_clock.py``) and
the test cluster's checker and producer. The policy, written once:

- **redis-py retries nothing** (``Retry(NoBackoff(), 0)`` on every client this caller holds):
  the caller owns waiting, so that it keeps to one deadline and logs what it waits for;
- **a call that got MOVED did not run**: the caller moves to the node the reply names
  (``redis_slot.follow_moved``) and the error is retried there;
- **a connection error or time-out** makes the caller ask where the flow's primary is now
  (``redis_slot.relocate``: a crashed Redis Cluster primary answers nothing, not MOVED; a
  Sentinel-managed client asks the Sentinels as it reconnects); with ``again_at_once``, the
  call is sent once more at once when the primary moved;
- **what is retried** is what :func:`~.store_errors.transient` calls transient (connection
  errors, time-outs, MOVED, CLUSTERDOWN, TRYAGAIN, READONLY, LOADING, NOREPLICAS...), with
  :class:`~twinflow.runtime.waiting.Backoff`'s pauses, until the caller's deadline, when
  ``give_up`` names the error to raise. Anything else propagates at once.

Under failure: :meth:`attempt` tries once (moving the client where the primary went) and
raises what Redis raised; :meth:`call` waits as above. The client is made on first use
(``connect``), so a caller built while Redis is down waits for it like any call.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..waiting import Backoff, retry
from .redis_slot import follow_moved, relocate
from .store_errors import transient

T = TypeVar("T")


def without_retries(client: redis.Redis) -> redis.Redis:
    """``client`` with redis-py's own retries off: its caller owns waiting (see module)."""
    client.set_retry(Retry(NoBackoff(), 0))
    return client


def retryable(exc: BaseException) -> bool:
    """Whether waiting may help: a Redis error that :func:`~.store_errors.transient` calls transient."""
    return isinstance(exc, redis.RedisError) and transient(exc)


class RedisCaller:
    """A flow's Redis client that follows the flow's primary, and the one retry policy (see module).

    ``connect`` makes the first client (or ``client`` is given); ``on_client(client)`` is told
    of every client the caller moves to (the store registers its scripts there)."""

    def __init__(self, connect: Callable[[], redis.Redis] | None = None, *, client: redis.Redis | None = None,
                 on_client: Callable[[redis.Redis], None] | None = None, again_at_once: bool = False,
                 backoff: Backoff = Backoff(), sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic):
        if (connect is None) == (client is None):
            raise ValueError("a RedisCaller needs exactly one of connect and client")
        self._connect, self._on_client, self.again_at_once = connect, on_client, again_at_once
        self.backoff, self._sleep, self._monotonic = backoff, sleep, monotonic
        self._moving = threading.Lock()  # one thread at a time looks for the flow's primary
        self._client: redis.Redis | None = None
        if client is not None:
            self.use(client)

    @property
    def client(self) -> redis.Redis:
        """The client in use now (made with ``connect`` on first use)."""
        if self._client is None:
            self.use(self._connect())
        return self._client

    def use(self, client: redis.Redis) -> None:
        """Call through ``client`` from now on."""
        self._client = without_retries(client)
        if self._on_client is not None:
            self._on_client(client)

    def attempt(self, fn: Callable[[redis.Redis], T]) -> T:
        """``fn(client)`` once; on MOVED or a connection error, the client moves where the flow's
        primary is now (and, with ``again_at_once``, ``fn`` runs once more there), and the
        error propagates."""
        client = self.client
        try:
            try:
                return fn(client)
            except (redis.ConnectionError, redis.TimeoutError):
                if not (self._relocate(client) and self.again_at_once):
                    raise
                return fn(self.client)  # the flow's primary is elsewhere now: once more, there
        except redis.exceptions.MovedError as moved:
            self.use(follow_moved(self.client, moved))
            raise

    def call(self, fn: Callable[[redis.Redis], T], *, deadline_s: float | None,
             give_up: Callable[[BaseException, float], BaseException],
             on_retry: Callable[[BaseException, float, float], None] | None = None,
             on_failure: Callable[[BaseException], None] | None = None) -> T:
        """``fn(client)`` until it returns, waiting out what is transient up to ``deadline_s``
        (None: no deadline; 0: one attempt); then ``give_up(error, waited)`` is raised.
        ``on_failure(error)`` hears of every attempt Redis failed, ``on_retry(error, waited,
        pause)`` runs before each pause (it may log, or raise to stop)."""
        def attempt() -> T:
            try:
                return self.attempt(fn)
            except redis.RedisError as exc:
                if on_failure is not None:
                    on_failure(exc)
                raise

        return retry(attempt, retryable=retryable, deadline_s=deadline_s, give_up=give_up, on_retry=on_retry,
                     sleep=self._sleep, monotonic=self._monotonic, backoff=self.backoff)

    def _relocate(self, failed: redis.Redis) -> bool:
        """After ``failed`` gave a connection error: True when the caller now uses a client on
        another node (the primary that serves the flow now), else False."""
        with self._moving:
            if self._client is not failed:  # another thread moved already
                return True
            try:
                moved = relocate(failed)
            except redis.RedisError:
                return False
            if moved is failed:
                return False
            self.use(moved)
            return True

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
