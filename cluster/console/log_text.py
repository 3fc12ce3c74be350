"""Control characters escaped in every value the console logs: :func:`printable` and the filter
on the ``twinflow.console`` logger, installed on import.

A request's path, its Host, an operator's name or an audit ID comes from a client: a ``%0A``
in a path, decoded, would start a new line in a text log and forge an entry. So every
argument of a console log line, and every field of a console event, has its control
characters (C0, C1, DEL, the Unicode line and paragraph separators and the direction
marks) written as escapes before any handler sees it; the sentences the code writes are left
as they are. Under failure: a value that is not text is left to the formatter; nothing here
raises.

>>> printable("GET /x\\nINFO forged line\\r\\x1b[31m")
'GET /x\\\\nINFO forged line\\\\r\\\\x1b[31m'
>>> printable({"refs": ["a\\nb"]})
{'refs': ['a\\\\nb']}
"""

from __future__ import annotations

import logging
import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Attributes every LogRecord has: any other came in through ``extra`` (an event's fields).
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _escape(match: re.Match) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def printable(value: Any) -> Any:
    """``value`` with the control characters of every text in it escaped (lists, tuples and dicts
    walked); anything else as it is."""
    if isinstance(value, str):
        return _CONTROL.sub(_escape, value)
    if isinstance(value, bytes):
        return printable(value.decode("utf-8", "backslashreplace"))
    if isinstance(value, (list, tuple)):
        return type(value)(printable(v) for v in value)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    return value


class EscapeControls(logging.Filter):
    """Escapes control characters in a record's arguments and extra fields (see the module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if isinstance(record.args, dict):
                record.args = printable(record.args)
            elif record.args:
                record.args = tuple(printable(a) for a in record.args)
            for key, value in list(vars(record).items()):
                if key not in _STANDARD:
                    setattr(record, key, printable(value))
        except Exception:  # a log line must come out whatever it holds
            pass
        return True


_FILTER = EscapeControls()
logging.getLogger("twinflow.console").addFilter(_FILTER)
