"""Hostile producers: messages whose values are anything the JSON parser accepts.

Each hostile message is a message of the flow (an order with its own ID, history
uuid, join activation and sort key, so it meets no one else's) in which one or
two of the fields a node uses, the ID, the history uuid, the join's type or
activation, the sort key or a field no node reads, hold a hostile value:
lone UTF-16 surrogates (as ``\\ud800`` escapes, or encoded in the body's bytes),
NUL, right-to-left marks and other format characters, emoji, long text,
huge and non-finite numbers (``NaN``, ``Infinity``, a 5,000-digit integer),
``null``, booleans, arrays, objects and deep nesting, and an integer ID.

What the flow must do with one (``checker.Checker``): it leaves exactly once,
through the flow (by its ID) or by the failure path (by its uplink position,
with a reason), and the flow goes on. :func:`make` returns the body and the
ID the message would leave the flow under (None when it has no usable one);
IDs never hold ``+`` (the checker splits a group's IDs on it).
"""

from __future__ import annotations

import json
import random

TEXTS = ["\ud800", "\udfff", "x\udc00y", "\ud83d", "a\x00b", "\x00", "\u202eevil\u202c", "\u200f\u05d0\u05d1",
         "\ufeff", "\u2028\u2029", "\U0001F600", "\u0301", "\\", '"', "", " ", "\t\n", "\x7f\x1b[31m",
         "{order_id}", "null", "NaN", "x" * 300, "\uffff", "\U0010ffff"]


class Raw:
    """JSON text written as is (what json.dumps will not write: huge numbers, deep nesting)."""

    def __init__(self, text: str):
        self.text = text


def _values(rng: random.Random) -> object:
    pick = rng.randrange(12)
    if pick < 5:
        return rng.choice(TEXTS)
    return rng.choice([
        None, True, False, 0, -1, 10 ** 18, 1.5, float("nan"), float("inf"), float("-inf"), [], {},
        [1, "\ud800"], {"a": {"b": "\u202e"}}, Raw("1" + "0" * 5000), Raw("[" * 300 + "]" * 300),
        Raw("[" * 20 + "1" + "]" * 20), Raw("-0"), Raw("1e400"), Raw("123456789012345678901234567890"),
    ])


def _dump(value: object, ascii_only: bool) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dump(v, ascii_only)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dump(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)


def make(rng: random.Random, n: int) -> tuple[bytes, str | None, str]:
    """Hostile message ``n``: (body, the ID it would leave under or None, what is hostile)."""
    doc: dict[str, object] = {"id": f"h{n:05d}", "uuid": f"hostile-{n}", "type": "order",
                              "order_id": f"h{n}", "seq": 900_000 + n}
    fields = rng.sample(["id", "uuid", "type", "order_id", "seq", "note"], rng.choice([1, 1, 2]))
    for f in fields:
        value = _values(rng)
        if f == "id" and isinstance(value, str):
            value = f"h{n:05d}" + value.replace("+", "")   # still its own ID
        elif f == "id" and isinstance(value, int) and not isinstance(value, bool):
            value = rng.choice([1, -1]) * (10 ** 15 + n)    # an integer ID, its own
        elif f == "id" and isinstance(value, Raw) and value.text[:1] in "-0123456789":
            value = Raw(rng.choice([f"-{n}", f"{n}" + "0" * 40, f"{n}" + "0" * 5000, f"{n}.0", f"{n}e3"]))
        doc[f] = value
    ascii_only = rng.random() < 0.7   # else the text goes as UTF-8, surrogates encoded (invalid UTF-8)
    text = "{" + ", ".join(f"{json.dumps(k)}: {_dump(v, ascii_only)}" for k, v in doc.items()) + "}"
    body = text.encode("utf-8", "surrogatepass")
    mid = doc["id"]
    if isinstance(mid, Raw):
        try:
            mid = json.loads(mid.text)
        except ValueError:
            mid = None
    if isinstance(mid, bool) or not isinstance(mid, (str, int)):
        out_id = None
    else:
        out_id = str(mid)
    what = ", ".join(f"{f}={_short(doc[f])}" for f in fields)
    return body, out_id, what


def _short(value: object) -> str:
    if isinstance(value, Raw):
        return value.text[:12] + ("..." if len(value.text) > 12 else "")
    text = ascii(value)
    return text[:40] + ("..." if len(text) > 40 else "")
