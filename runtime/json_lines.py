"""JSON objects one a line: what a samples file (``twinflow drill --samples``) and ``twinflow
publish`` read.

Under failure: the first line that is not JSON, or not a JSON object, raises
:class:`JsonLinesError` naming the source and the line; nothing is returned for part of it.

>>> json_objects(['{"id": "a"}', '', '{"id": "b"}'], "stdin")
[{'id': 'a'}, {'id': 'b'}]
>>> json_objects(['{"id": "a"}', '[1]'], "orders.jsonl")
Traceback (most recent call last):
...
twinflow.runtime.json_lines.JsonLinesError: orders.jsonl, line 2: not a JSON object (a list)
"""

from __future__ import annotations

import json
from collections.abc import Iterable


class JsonLinesError(ValueError):
    """A line that is no JSON object; the message names the source and the line."""


def json_objects(lines: Iterable[str], source: str) -> list[dict]:
    """The JSON object of each non-blank line of ``lines`` (from ``source``, for the error)."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise JsonLinesError(f"{source}, line {n}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise JsonLinesError(f"{source}, line {n}: not a JSON object (a {type(doc).__name__})")
        out.append(doc)
    return out
