"""Sort keys: the one reader of a key value as ``int``, ``float`` or ``str``.

The claim pair's key (read from each uplink message, and carried in every
escalation as text), the sort node's ruleset keys and anything else that
orders messages read keys here, so a value is a key everywhere or nowhere.
A key never converts with loss and always orders:

- ``int``: an integer, an integral float (``7.0``) or a decimal string
  (``"7"``, ``" -3 "``), of at most ``max_digits`` digits; never a bool,
  ``7.5`` or ``"7.5"``;
- ``float``: a number or a numeric string, finite (NaN does not order, and
  an infinity would sort after every real key and hide the rest);
- ``str``: a string only (``7`` is not the string ``"7"``: ``"10" < "9"``).

Anything else raises :class:`~twinflow.runtime.fields.BadInput` with the reason.

>>> parse_key("int", "7"), parse_key("int", 7.0), parse_key("float", "2.5")
(7, 7, 2.5)
>>> parse_key("float", float("inf"))
Traceback (most recent call last):
...
twinflow.runtime.fields.BadInput: key inf is not a finite float
"""

from __future__ import annotations

import math
import re
from typing import Any

from .fields import BadInput

KEY_TYPES = ("int", "float", "str")
_INT = re.compile(r"[+-]?[0-9]+")
_SHOW = 80  # characters of a bad value a reason shows


def _show(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= _SHOW else f"{text[:40]}... ({len(text)} characters)"


def parse_key(key_type: str, raw: Any, max_digits: int = 100) -> Any:
    """``raw`` as a key of ``key_type``; BadInput says why it is not one."""
    if key_type == "int":
        if isinstance(raw, bool):
            raise BadInput(f"key {_show(raw)} is not an int")
        if isinstance(raw, int):
            if raw and math.log10(abs(raw)) >= max_digits:
                raise BadInput(f"key is longer than {max_digits} digits")
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str) and _INT.fullmatch(raw.strip()):
            if len(raw.strip().lstrip("+-")) > max_digits:
                raise BadInput(f"key {_show(raw)} is longer than {max_digits} digits")
            return int(raw)
        raise BadInput(f"key {_show(raw)} is not an int")
    if key_type == "float":
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise BadInput(f"key {_show(raw)} is not a float")
        try:
            key = float(raw)
        except (ValueError, OverflowError):
            raise BadInput(f"key {_show(raw)} is not a float") from None
        if not math.isfinite(key):
            raise BadInput(f"key {_show(raw)} is not a finite float")
        return key
    if key_type == "str":
        if isinstance(raw, str):
            return raw
        raise BadInput(f"key {_show(raw)} is not a str")
    raise ValueError(f"key_type must be one of {', '.join(KEY_TYPES)} (got {key_type!r})")
