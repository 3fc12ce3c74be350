"""Figures of a bench run several times: the median and the spread of each, and the CPU of a
server the measured pipeline shares (Redis) charged to a span.

A speed figure on two shared cores swings by 15-30% from one run to the next and by up to 2 ×
from one hour to the next, so a bench runs its configurations interleaved (A, B, A, B, ...)
in one invocation and reports, for each figure, the median and the spread of its runs: a
change smaller than the spread is noise.

Under failure: a run that produced no value for a figure (None) is left out of that figure's
summary; a figure with no value at all summarises as None.
"""

from __future__ import annotations

import math
from typing import Iterable

from twinflow.testing.proc_stats import TICKS, cpu_ticks


def median(values: Iterable[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    values = sorted(values)
    if not values:
        raise ValueError("the median of no values")
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile by nearest rank: the smallest value with at least ``q`` of them at or
    below it (p99 of 100 values is the 99th)."""
    values = sorted(values)
    if not values:
        raise ValueError("a quantile of no values")
    return values[max(0, math.ceil(q * len(values)) - 1)]


def spread(values: Iterable[float | None], digits: int = 3) -> dict | None:
    """``{"median", "min", "max", "spread", "runs"}`` of the values given (None left out);
    ``spread`` is (max - min) / median, 0 for one run; None when no value was given."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    mid = median(kept)
    return {"median": round(mid, digits), "min": round(min(kept), digits), "max": round(max(kept), digits),
            "spread": round((max(kept) - min(kept)) / mid, 3) if mid else 0.0, "runs": len(kept)}


def summarise(runs: list[dict], digits: int = 3) -> dict:
    """Per key of the runs' numeric figures, :func:`spread` over the runs that have it."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k, v in run.items() if k not in keys and (v is None or isinstance(v, (int, float)))
                 and not isinstance(v, bool)]
    return {k: spread((run.get(k) for run in runs), digits) for k in keys}


def ratio(numerator: float | None, denominator: float | None, digits: int = 3) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, digits)


class ServerCpu:
    """The CPU a server process (Redis) uses over spans, to charge to what ran meanwhile.

    ``start()`` then ``stop()`` around a span; ``ticks`` is what the server used in it. A server
    shared by what is measured and what is idle meanwhile is charged whole to the span: its idle
    clients' polls are a small, constant part (stated where figures are written)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._at: int | None = None
        self.ticks = 0

    def start(self) -> None:
        self._at = cpu_ticks(self.pid)

    def stop(self) -> int:
        if self._at is None:
            raise RuntimeError("ServerCpu.stop() without start()")
        used, self._at = cpu_ticks(self.pid) - self._at, None
        self.ticks += used
        return used


def us_per_message(ticks: int, messages: int) -> float:
    """CPU ticks spent on ``messages`` messages, in microseconds per message."""
    return round(ticks / TICKS / messages * 1e6, 1)
