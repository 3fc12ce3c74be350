"""Fixed-bucket histograms a member or a peer keeps in memory, and the metrics endpoint reads.

Observed once per batch or firing round (never per message); ``observe`` and
``snapshot`` may be called from any thread.

>>> t = Timings((0.1, 1.0))
>>> t.observe(0.05); t.observe(0.5); t.observe(3.0)
>>> t.snapshot()
([('0.1', 1), ('1.0', 2), ('+Inf', 3)], 3.55)
"""

from __future__ import annotations

import bisect
import threading
from typing import Iterable

BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Timings:
    """A fixed-bucket histogram (seconds), observed once per batch or firing round, read by a scrape."""

    def __init__(self, buckets: Iterable[float] = BATCH_BUCKETS):
        self.bounds = tuple(sorted(buckets))
        self._counts = [0] * (len(self.bounds) + 1)  # the last one: over every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative (upper bound, count) pairs, +Inf last, and the sum: a histogram's samples."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        out, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], counts):
            running += n
            out.append((bound, running))
        return out, total


class BatchTimings:
    """Batch durations per role the member had when the batch started (a histogram each). The
    ``roles`` given exist from the start, so a series is there (at 0) before its first batch."""

    def __init__(self, roles: Iterable[str] = ()):
        self.by_role: dict[str, Timings] = {role: Timings(BATCH_BUCKETS) for role in roles}
        self._lock = threading.Lock()

    def observe(self, role: str, seconds: float) -> None:
        timings = self.by_role.get(role)
        if timings is None:
            with self._lock:
                timings = self.by_role.setdefault(role, Timings(BATCH_BUCKETS))
        timings.observe(seconds)
