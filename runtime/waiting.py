"""Waiting, once: ``retry`` (call until it works, with a back-off and a deadline) and ``wait_for``
(poll a condition until it holds, with a deadline).

Every loop that waits for a server goes through :func:`retry`: the store's
Redis calls, connecting to Redis and ZooKeeper, and the Spark source's
reads. Each passes its own policy (what is worth retrying, what to raise at
the deadline, what to log) and its own ``sleep`` and ``monotonic``, so the
waiting is testable without waiting.

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
from typing import Callable, TypeVar

T = TypeVar("T")


def retry(
    attempt: Callable[[], T],
    *,
    retryable: Callable[[BaseException], bool],
    deadline_s: float | None,
    give_up: Callable[[BaseException, float], BaseException],
    on_retry: Callable[[BaseException, float, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    first_backoff_s: float = 0.05,
    max_backoff_s: float = 1.0,
) -> T:
    """``attempt()`` until it returns.

    An exception ``retryable`` refuses propagates at once. Past ``deadline_s``
    (None: no deadline; 0: one attempt) the exception ``give_up(last error,
    seconds waited)`` is raised. ``on_retry(error, waited, pause)`` runs before
    each pause: it may log, or raise to stop waiting. The pause doubles from
    ``first_backoff_s`` up to ``max_backoff_s`` and never passes the deadline.
    """
    began = monotonic()
    backoff = first_backoff_s
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            waited = monotonic() - began
            if deadline_s is not None and waited >= deadline_s:
                raise give_up(exc, waited) from exc
            pause = backoff if deadline_s is None else min(backoff, max(0.0, deadline_s - waited))
            if on_retry is not None:
                on_retry(exc, waited, pause)
            sleep(pause)
            backoff = min(backoff * 2, max_backoff_s)


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
