"""Compact JSON text of what a master step writes (state entries, output messages), fast,
and read back fast (``loads``).

``compact(obj)`` means what ``json.dumps(obj, separators=(",", ":"))``
means: a reader's ``json.loads`` gets an equal object back. It encodes with
orjson (several times faster than the standard library) and falls back to
the standard library wherever orjson would write something else or refuse:

- integers beyond 64 bits, keys that are not strings, types orjson does not
  know: orjson raises, the standard library writes them as it always did;
- NaN and the infinities, which ``json.loads`` accepts in an uplink body:
  orjson writes ``null`` for them, so any text with ``null`` in it is written
  again by the standard library (``NaN`` stays ``NaN``).

The text can differ in bytes from the standard library's (orjson writes
non-ASCII characters as UTF-8, not ``\\uXXXX``), never in meaning. So it is
for values only: a name that is looked up by its text (a state entry's
field in Redis) is written by ``key_text``, which is ``json.dumps`` to the
byte, only faster for the usual keys (strings and integers).

>>> compact({"a": [1, 2.5, "x"], "b": None}) == json.dumps({"a": [1, 2.5, "x"], "b": None}, separators=(",", ":"))
True
>>> json.loads(compact({"n": float("nan")}))["n"] != json.loads(compact({"n": float("nan")}))["n"]
True
>>> compact({"big": 2 ** 70})
'{"big":1180591620717411303424}'

``loads(text)`` means what ``json.loads(text)`` means; it decodes with orjson
and gives the standard library whatever orjson refuses (NaN, a lone
surrogate) or would read otherwise (an integer beyond 64 bits, which orjson
makes a float): a new master reads every state entry at promotion,
so this is on its recovery time (50,000 history entries: about 360 ms of
decoding with the standard library, 120 ms with orjson, measured).

>>> loads('{"a":[1,2.5,"x"],"b":null}') == json.loads('{"a":[1,2.5,"x"],"b":null}')
True
>>> loads(b'[NaN, 1180591620717411303424]')[1]
1180591620717411303424
>>> [key_text(k) == json.dumps(k) for k in ("café", 7, -2 ** 80, True, None, 1.5, ("a", 1))]
[True, True, True, True, True, True, True]
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring_ascii
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


# orjson reads an integer beyond 64 bits as a float (it does not refuse it): any run of
# LONG_RUN digits or more (the shortest such integer, -9223372036854775809) goes to the
# standard library.
LONG_RUN = 19
_LONG_DIGITS = re.compile("[0-9]{%d}" % LONG_RUN)
_LONG_DIGITS_BYTES = re.compile(b"[0-9]{%d}" % LONG_RUN)


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, faster (see the module doc).

    >>> loads(b'{"big": 123456789012345678901234567890}')["big"]
    123456789012345678901234567890
    """
    long_digits = _LONG_DIGITS_BYTES if isinstance(text, bytes) else _LONG_DIGITS
    return loads_known(text, long_digits.search(text) is not None)


def loads_known(text: str | bytes, long_run: bool) -> Any:
    """:func:`loads` for a caller that knows already whether ``text`` holds a run of
    ``LONG_RUN`` digits (``message.decode`` counts digits anyway)."""
    if long_run:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def key_text(key: Any) -> str:
    """``json.dumps(key)``, byte for byte (the name of a state entry is looked up by it).

    >>> [key_text(k) == json.dumps(k) for k in ("é", 7, ("on", 'say "é" \u202e'), ("a", 1), ())]
    [True, True, True, True, True]
    """
    kind = type(key)
    if kind is str:
        return encode_basestring_ascii(key)  # what json.dumps does with a str
    if kind is int:
        return int.__repr__(key)
    if kind is tuple and all(type(part) is str for part in key):  # a history's (trigger, uuid)
        return "[" + ", ".join(map(encode_basestring_ascii, key)) + "]"
    return json.dumps(key)
