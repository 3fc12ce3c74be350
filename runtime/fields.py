"""Reading values out of a message document: field paths and key templates.

A field path names one value: ``doc.seq`` or ``/doc/seq`` (both reach
``{"doc": {"seq": 3}}``). A template builds a text from several:
``"{region}-{order.id}"``. A template that is exactly one placeholder
(``"{seq}"``) returns the value itself, so a numeric key stays numeric.

Both raise :class:`MissingField` naming the path when the document lacks it,
so a node can send the message to its failure outlink with that reason.
:class:`BadInput` is the one error type for a message the flow cannot take
(MissingField is one); every reader and node raises it, or a subclass.

>>> FieldPath("/doc/seq").get({"doc": {"seq": 3}})
3
>>> Template("{a}-{b.c}").render({"a": 1, "b": {"c": "x"}})
'1-x'
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


class BadInput(ValueError):
    """A message the flow cannot process as it is: the one bad-input error of every reader and node.

    Its text (``reason``) is what the failure outlink, or the failure stream, records.
    """

    @property
    def reason(self) -> str:
        return str(self)


class MissingField(BadInput, KeyError):
    """The document lacks a field a path names (a KeyError too, for callers that look up values)."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path

    def __str__(self) -> str:
        return f"message has no field '{self.path}'"


class FieldPath:
    """A dotted (``a.b``) or slashed (``/a/b``) path into a JSON document."""

    def __init__(self, path: str):
        parts = [p for p in re.split(r"[./]", path.strip()) if p]
        if not parts:
            raise ValueError(f"empty field path {path!r}")
        self.path = path
        self.parts = tuple(parts)

    def get(self, doc: Mapping[str, Any]) -> Any:
        value: Any = doc
        for part in self.parts:
            if type(value) is dict:  # the common case, without the slower ABC check
                if part not in value:
                    raise MissingField(self.path)
                value = value[part]
            elif isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise MissingField(self.path)
        return value

    def __repr__(self) -> str:
        return f"FieldPath({self.path!r})"


class Template:
    """A text built from field paths: ``"{region}-{seq}"``."""

    def __init__(self, template: str):
        self.template = template
        self.fields = [FieldPath(m) for m in _PLACEHOLDER.findall(template)]
        if not self.fields:
            raise ValueError(f"template {template!r} names no field (write {{field}})")
        self._single = _PLACEHOLDER.fullmatch(template) is not None
        self._pieces = _PLACEHOLDER.split(template)  # text, field, text, field, ...

    def render(self, doc: Mapping[str, Any]) -> Any:
        if self._single:
            return self.fields[0].get(doc)
        out = []
        for i, piece in enumerate(self._pieces):
            out.append(piece if i % 2 == 0 else str(self.fields[i // 2].get(doc)))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.template!r})"
