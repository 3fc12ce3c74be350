"""The flow's clock: the Redis server's time (``TIME``), as this peer estimates it.

A master stores deadlines in Redis as epoch seconds by the flow's clock,
and after a failover the other peer fires them by its own. Were that each
peer's wall clock, a peer 5 s ahead would fire the old master's time-outs
5 s early. So the flow's time is Redis's, which already dates the uplink's
entry IDs: :class:`RedisTimeClock` samples ``TIME``, takes the answer as
Redis's time at the midpoint of the round trip, and runs it on by the local
monotonic clock. A step or a skew of this machine's wall clock changes
nothing. It samples again every ``resample_s`` (10 s): the ``now()`` that
finds a sample due starts it on a thread of its own and answers at once,
so no caller waits for Redis; a call is a lock and an addition.

Under failure:

- ``now()`` never goes backwards. A sample behind the last answer (a
  failover to a Redis host whose clock is behind) holds the clock there until
  Redis's time catches up: time-outs fire that much later. One ahead moves
  it forward at once: they fire that much earlier.
- Redis down: a failed sample (any error) keeps the last estimate, which
  runs on by the monotonic clock, and is tried again ``retry_s`` (1 s)
  later, not on every call. No ``now()`` waits for a sample, which takes
  at most :class:`RedisTime`'s time-outs.
- Until Redis first answers, the clock is this machine's wall clock; from the
  first sample on it is Redis's (held, as above, if the wall clock was ahead).
- An estimate is off by at most half its sample's round trip (``round_trip_s``).
- ``offset_s`` (this machine's wall clock minus Redis's time) is logged once
  (``clock_offset``, WARNING) when it is over 1 s, and again only after it
  came back within half of that.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Union

import redis

from ..logs import event
from ..runtime.store.redis_auth import client_options, connect_error
from ..runtime.store.redis_caller import RedisCaller
from ..runtime.store.redis_slot import client_from_url

log = logging.getLogger("twinflow.clock")

OFFSET_WARN_S = 1.0  # an offset over this is logged: the peers' clocks are worth fixing (logs, certificates)

TimeAnswer = Union[float, tuple[int, int]]  # epoch seconds, or TIME's (seconds, microseconds)


class RedisTimeClock:
    """Redis's time as this process estimates it (see the module doc); fills ``runtime.clock.Clock``.

    ``time_source()`` returns Redis's time (e.g. :class:`RedisTime`); ``monotonic``
    measures round trips and runs the estimate on; ``wall`` is this machine's clock,
    used before the first sample and for ``offset_s``; ``spawn(fn)`` runs a due sample (default: on
    a new daemon thread; a test runs it at once). ``peer`` names the process in its log.
    """

    def __init__(self, time_source: Callable[[], TimeAnswer], *, resample_s: float = 10.0, retry_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 spawn: Callable[[Callable[[], None]], None] | None = None, peer: str | None = None):
        self._source, self.resample_s, self.retry_s = time_source, resample_s, retry_s
        self._monotonic, self._wall, self._peer = monotonic, wall, peer
        self._spawn = spawn or _on_a_thread
        self._state = threading.Lock()     # the estimate and the last answer; held for arithmetic only
        self._sampling = threading.Lock()  # one sample at a time
        self._redis_at: float | None = None  # Redis's time at monotonic time _mono_at (the last sample's midpoint)
        self._mono_at = 0.0
        self._last = float("-inf")         # the last answer of now(): it never goes below
        self._due = float("-inf")          # monotonic time of the next sample
        self._cold = True                  # no sample yet, or the last one failed: its connection is new
        self._failing = False
        self._warned = False
        self.offset_s: float | None = None     # wall clock minus Redis's time, at the last sample
        self.round_trip_s: float | None = None  # the last sample's round trip

    def now(self) -> float:
        """The flow's time, epoch seconds; never less than an earlier answer."""
        # A due sample runs apart: the timers and the batches call this, and neither may wait
        # for a Redis that does not answer (a master's lease check runs on the timer thread).
        if self._monotonic() >= self._due and self._sampling.acquire(blocking=False):
            try:
                self._spawn(self._sample_due)
            except Exception:  # no thread to be had: try again later, on the estimate meanwhile
                self._due = self._monotonic() + self.retry_s
                self._sampling.release()
        with self._state:
            if self._redis_at is None:
                t = self._wall()
            else:
                t = self._redis_at + (self._monotonic() - self._mono_at)
            if t > self._last:
                self._last = t
            return self._last

    def sample(self) -> bool:
        """Sample Redis's time now, due or not, and wait for it; False when that failed (the
        estimate is kept)."""
        with self._sampling:
            return self._sample()

    def _sample_due(self) -> None:
        """A sample ``now()`` found due (it holds ``_sampling`` for this)."""
        try:
            if self._monotonic() >= self._due:
                self._sample()
        finally:
            self._sampling.release()

    def _sample(self) -> bool:
        cold = self._cold
        if not self._take():
            return False
        if cold:
            # That round trip may have included connecting (TCP, TLS, AUTH, asking the Sentinels),
            # which skews its midpoint: measure again on the open connection.
            self._take()
        return True

    def _take(self) -> bool:
        began = self._monotonic()
        try:
            answer = self._source()
            redis_t = float(answer) if isinstance(answer, (int, float)) else answer[0] + answer[1] / 1e6
        except Exception as exc:  # Redis down, a time-out, a failover under way: keep the estimate
            self._failed(exc)
            return False
        ended = self._monotonic()
        mid = (began + ended) / 2
        offset = self._wall() - (redis_t + (ended - mid))
        with self._state:
            self._redis_at, self._mono_at = redis_t, mid
            self.offset_s, self.round_trip_s = offset, ended - began
        self._due = ended + self.resample_s
        self._cold = False
        if self._failing:
            self._failing = False
            log.info("the flow's clock reads Redis's time again (this machine's clock is %+.3f s off it)", offset)
        self._note_offset(offset)
        return True

    def _failed(self, exc: Exception) -> None:
        self._due = self._monotonic() + self.retry_s
        self._cold = True
        if not self._failing:  # once per run of failures: Redis being down is logged by the stores
            self._failing = True
            log.info("the flow's clock cannot read Redis's time (%s: %s); it runs on %s", type(exc).__name__, exc,
                     "its last sample" if self._redis_at is not None else "this machine's clock until Redis answers")

    def _note_offset(self, offset: float) -> None:
        if abs(offset) > OFFSET_WARN_S and not self._warned:
            self._warned = True
            event(log, logging.WARNING, "clock_offset",
                  "this machine's clock is %+.3f s off the Redis server's; the flow's time follows Redis's "
                  "(time-outs, bake, retention), so this moves none of them, but keep the clocks in sync "
                  "(NTP) for logs and certificates", offset, peer=self._peer, seconds=round(offset, 3))
        elif abs(offset) <= OFFSET_WARN_S / 2:
            self._warned = False


def _on_a_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="twinflow-clock", daemon=True).start()


class RedisTime:
    """Redis's ``TIME`` as (seconds, microseconds), on a client made as a store's is
    (``redis_slot.client_from_url``: the URL's password and TLS files, or the environment's;
    the Sentinels' primary; on a Redis Cluster, the primary that owns ``slot_key``'s slot).

    The client is made at the first call, each of its calls bounded by ``timeout_s`` and none
    retried by redis-py: a sample that cannot be taken fails, and the clock tries again later. After a
    connection error the next call goes where the store would: a Sentinel-managed client asks
    the Sentinels as it reconnects (they also drop the connections to a primary they demote);
    on a Redis Cluster the slot's owner is looked for again. Errors carry no password.
    """

    def __init__(self, url: str, slot_key: str | None = None, timeout_s: float = 1.0):
        self.url, self.slot_key, self.timeout_s = url, slot_key, timeout_s
        # One sample, one attempt: the clock owns retrying (RedisTimeClock.retry_s); the caller
        # moves to wherever the flow's primary is after a connection error.
        self._caller = RedisCaller(lambda: client_from_url(
            self.url, socket_connect_timeout=self.timeout_s, socket_timeout=self.timeout_s, slot_key=self.slot_key))
        self._closed = False

    def __call__(self) -> tuple[int, int]:
        if self._closed:  # the peer stopped: a late sample must not connect again
            raise redis.ConnectionError("the peer's Redis TIME client is closed")
        try:
            return self._caller.attempt(lambda client: client.time())
        except Exception as exc:  # logged by the clock: take out any password redis-py echoes
            raise _scrubbed(exc, self.url) from None

    @property
    def client(self) -> redis.Redis:
        """The client the next sample goes to (made on first use): which server the clock reads."""
        return self._caller.client

    def close(self) -> None:
        self._closed = True
        self._caller.close()


def _scrubbed(exc: Exception, url: str) -> Exception:
    """``exc`` without the URL's password or the environment's (``redis_auth.connect_error``)."""
    try:
        options = client_options(url)
    except Exception:  # settings that cannot work: the store's connect says so
        options = None
    return connect_error(exc, url, options)
