"""Injected time.

Every time-out in twinflow reads time from a :class:`Clock`, never from the
``time`` module directly, so that tests move time by hand (``FakeClock``) and
replays move it by the recorded timestamps. ``now()`` is epoch seconds
because deadlines are stored and shared between peers; local waits use
``time.monotonic`` where nothing is shared. A peer's clock is the Redis
server's, as it estimates it (``cluster/flow_clock.py``), so that both peers
read those deadlines on the same clock.

>>> clock = FakeClock(100.0)
>>> clock.advance(2.5)
102.5
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    """Wall-clock time (seconds since the epoch)."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self.t += seconds
        return self.t

    def set(self, t: float) -> float:
        if t < self.t:
            raise ValueError("a clock does not go backwards")
        self.t = float(t)
        return self.t
