"""Compact JSON text of what a master step writes (state entries, output messages), fast.

``compact(obj)`` means what ``json.dumps(obj, separators=(",", ":"))``
means: a reader's ``json.loads`` gets an equal object back. It encodes with
orjson (several times faster than the standard library, measured: issue 9 in
bench/RESULTS.md) and falls back to the standard library wherever orjson
would write something else or refuse:

- integers beyond 64 bits, keys that are not strings, types orjson does not
  know: orjson raises, the standard library writes them as it always did;
- NaN and the infinities, which ``json.loads`` accepts in an uplink body:
  orjson writes ``null`` for them, so any text with ``null`` in it is written
  again by the standard library (``NaN`` stays ``NaN``).

The text can differ in bytes from the standard library's (orjson writes
non-ASCII characters as UTF-8, not ``\\uXXXX``), never in meaning. So it is
for values only: a name that is looked up by its text (a state entry's
field in Redis) keeps ``json.dumps``.

>>> compact({"a": [1, 2.5, "x"], "b": None}) == json.dumps({"a": [1, 2.5, "x"], "b": None}, separators=(",", ":"))
True
>>> json.loads(compact({"n": float("nan")}))["n"] != json.loads(compact({"n": float("nan")}))["n"]
True
>>> compact({"big": 2 ** 70})
'{"big":1180591620717411303424}'
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def compact(obj: Any) -> str:
    """``obj`` as compact JSON text (see the module doc)."""
    try:
        out = orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(obj, separators=(",", ":"))
    if b"null" in out:  # None, or a NaN/infinity orjson turned into null: let the standard library say
        return json.dumps(obj, separators=(",", ":"))
    return out.decode()
