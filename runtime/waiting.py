"""Waiting, once: :class:`Backoff` (the one back-off policy), ``retry`` (call until it works,
with a back-off and a deadline) and ``wait_for`` (poll a condition until it holds, with a
deadline).

Every loop that waits for a server goes through :func:`retry`: the store's
Redis calls, connecting to Redis and ZooKeeper, and the Spark source's
reads. Each passes its own policy (what is worth retrying, what to raise at
the deadline, what to log) and its own ``sleep`` and ``monotonic``, so the
waiting is testable without waiting. The loops that cannot be a call
retried (the escalation stream's reconnects, the client's calls with their
own per-error rules) take their pauses from a :class:`Backoff` too.

>>> from itertools import islice
>>> list(islice(Backoff(0.05, 0.3).pauses(), 5))
[0.05, 0.1, 0.2, 0.3, 0.3]
>>> [round(p, 3) for p in islice(Backoff(0.1, 1.0, jitter=lambda: 0.0).pauses(), 3)]
[0.05, 0.1, 0.2]

>>> calls = []
>>> def flaky():
...     calls.append(1)
...     if len(calls) < 3:
...         raise ConnectionError("down")
...     return "up"
>>> retry(flaky, retryable=lambda e: isinstance(e, ConnectionError), deadline_s=5.0,
...       give_up=lambda e, waited: TimeoutError(waited), sleep=lambda s: None)
'up'
>>> wait_for(lambda: len(calls) == 3, timeout_s=1.0)
True
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Pauses that double from ``first_s`` up to ``max_s``. With ``jitter`` (a callable giving
    a number in [0, 1)), each pause is drawn between half and all of the current value, so
    that clients that failed together do not all come back together."""

    first_s: float = 0.05
    max_s: float = 1.0
    jitter: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"a back-off needs 0 < first_s <= max_s, not {self.first_s} and {self.max_s}")

    def pauses(self) -> Iterator[float]:
        """The pauses, one per retry, for as long as the caller retries."""
        current = self.first_s
        while True:
            yield current if self.jitter is None else current * (0.5 + 0.5 * self.jitter())
            current = min(current * 2, self.max_s)


def retry(
    attempt: Callable[[], T],
    *,
    retryable: Callable[[BaseException], bool],
    deadline_s: float | None,
    give_up: Callable[[BaseException, float], BaseException],
    on_retry: Callable[[BaseException, float, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    backoff: Backoff = Backoff(),
) -> T:
    """``attempt()`` until it returns.

    An exception ``retryable`` refuses propagates at once. Past ``deadline_s``
    (None: no deadline; 0: one attempt) the exception ``give_up(last error,
    seconds waited)`` is raised. ``on_retry(error, waited, pause)`` runs before
    each pause: it may log, or raise to stop waiting. The pauses are ``backoff``'s,
    and never pass the deadline.
    """
    began = monotonic()
    pauses = backoff.pauses()
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            waited = monotonic() - began
            if deadline_s is not None and waited >= deadline_s:
                raise give_up(exc, waited) from exc
            pause = next(pauses)
            if deadline_s is not None:
                pause = min(pause, max(0.0, deadline_s - waited))
            if on_retry is not None:
                on_retry(exc, waited, pause)
            sleep(pause)


def wait_for(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.1,
             sleep: Callable[[float], None] = time.sleep,
             monotonic: Callable[[], float] = time.monotonic) -> T | None:
    """Poll ``predicate`` until it returns a truthy value (returned), or None at the deadline."""
    end = monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if monotonic() >= end:
            return None
        sleep(interval_s)


def wait_settled(read: Callable[[], T], quiet_s: float, timeout_s: float, interval_s: float = 0.1,
                 sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> T | None:
    """Poll ``read`` until its value has stayed the same for ``quiet_s`` (returned), or None at
    the deadline. What a judge of exactly-once waits for once everything arrived: an output that
    has stopped changing, so that a duplicate landing late is counted, not missed.

    >>> values, clock = iter([1, 2, 2, 2, 2, 2]), [0.0]
    >>> wait_settled(lambda: next(values), quiet_s=0.25, timeout_s=5.0, interval_s=0.1,
    ...              sleep=lambda s: clock.__setitem__(0, clock[0] + s), monotonic=lambda: clock[0])
    2
    """
    end = monotonic() + timeout_s
    last, since = read(), monotonic()
    while True:
        now = monotonic()
        if now - since >= quiet_s:
            return last
        if now >= end:
            return None
        sleep(interval_s)
        value = read()
        if value != last:
            last, since = value, monotonic()
