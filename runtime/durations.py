"""Durations, read one way everywhere: a number of seconds, or text such as ``"90"``, ``"90s"``,
``"15m"``, ``"1.5h"``, ``"7d"``.

Every duration of a flow file (a node's time-outs, bake and retention times, ``uplink.retention``,
the audit's and the streams' retention) and the spans of the operator commands (``--since 2d``)
are read here, so a value that is a duration in one place is one in every place.

>>> duration_s(30), duration_s("90"), duration_s("1.5h"), duration_s(" 7d "), duration_s("week"), duration_s(True)
(30.0, 90.0, 5400.0, 604800.0, None, None)
"""

from __future__ import annotations

import re
from typing import Any

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
FORMS = "seconds, or a number with s, m, h or d such as 90s, 15m or 7d"


def duration_s(value: Any) -> float | None:
    """Seconds from a number or a duration text; None when it is neither (a bool is neither)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.fullmatch(value)
        if m:
            return float(m[1]) * UNITS[m[2] or "s"]
    return None
