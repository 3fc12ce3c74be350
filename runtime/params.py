"""Typed, validated reads of flow-file values, each failure naming file, line, field and reason.

A :class:`Params` wraps one mapping of a flow file (the whole file, or one
node's parameters). Every read checks the type and the value and raises
:class:`FlowFileError` pointing at the offending line; nothing is ever
silently defaulted from a wrong value.

>>> doc = Doc("join:\\n  timeout: 5\\n", "f.yaml")
>>> p = Params(doc, "", doc.value).section("join")
>>> p.seconds("timeout")
5.0
>>> p.seconds("bake")
Traceback (most recent call last):
...
twinflow.runtime.params.FlowFileError: f.yaml:2: join.bake: is required
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import yaml

from .durations import duration_s

DURATION_FORMS = "a number, or a number with s, m, h or d such as 90s, 15m or 7d"
from .fields import FieldPath, Template

_MISSING: Any = ...
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # flow, node and stream names


class FlowFileError(ValueError):
    """A flow file was refused: ``file``, ``line`` (or None), ``field`` and ``reason`` say why."""

    def __init__(self, file: str, line: int | None, field: str, reason: str):
        self.file, self.line, self.field, self.reason = file, line, field, reason
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {reason}")


class Refusals:
    """Where the flow file's readers put what they refuse: raised at once (the default, what
    ``twinflow run`` and ``replay`` do), or, with ``collect``, kept so that one pass over the file
    reports every refusal (``twinflow validate``). A reader marks each part it reads on its own
    (a node, a section) as a ``unit``: a refusal ends that unit only, and what depends on it is
    left unchecked rather than refused twice.
    """

    def __init__(self, collect: bool = False):
        self.collect = collect
        self.found: list[FlowFileError] = []

    def add(self, exc: FlowFileError) -> None:
        """Raise ``exc``, or keep it (once) when collecting."""
        if not self.collect:
            raise exc
        if all(str(e) != str(exc) for e in self.found):
            self.found.append(exc)

    @contextmanager
    def unit(self) -> Iterator[None]:
        """A part read on its own: its first refusal ends it (and is raised, or kept)."""
        try:
            yield
        except FlowFileError as exc:
            self.add(exc)


class Doc:
    """Plain Python values from one YAML text, plus the line of every field path."""

    def __init__(self, text: str, file: str):
        self.file = file
        # A flow's text is parsed again at every promotion (FlowGraph.fresh): keep the last
        # few parses, and hand out copies so that no reader changes another's values.
        value, lines = _parsed(text, file)
        self.value, self.lines = copy.deepcopy(value), dict(lines)

    @classmethod
    def parse(cls, text: str, file: str) -> tuple[Any, dict[str, int]]:
        doc = cls.__new__(cls)
        doc.file, doc.lines = file, {}
        try:
            root = yaml.compose(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise FlowFileError(file, mark.line + 1 if mark else None, "(file)", f"not valid YAML: {exc}") from None
        if root is None:
            raise FlowFileError(file, None, "(file)", "the file is empty")
        return doc._plain(root, ""), doc.lines

    def _plain(self, node, path: str):
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out = {}
            for k, v in node.value:
                key = str(yaml.safe_load(yaml.serialize(k)))
                sub = f"{path}.{key}" if path else key
                if key in out:
                    raise FlowFileError(self.file, k.start_mark.line + 1, sub, "appears twice")
                out[key] = self._plain(v, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._plain(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        return yaml.safe_load(yaml.serialize(node))

    def error(self, path: str, reason: str) -> FlowFileError:
        probe = path
        while probe and probe not in self.lines:  # a missing field: point at its parent
            probe = probe.rpartition(".")[0]
        return FlowFileError(self.file, self.lines.get(probe), path, reason)


@functools.lru_cache(maxsize=16)
def _parsed(text: str, file: str) -> tuple[Any, dict[str, int]]:
    return Doc.parse(text, file)


class Params:
    """Typed reads of one mapping; see the module docstring."""

    def __init__(self, doc: Doc, path: str, value: Any):
        self.doc, self.path = doc, path
        if not isinstance(value, dict):
            raise doc.error(path or "(file)", "must be a mapping")
        self.value = value

    # -- plumbing ---------------------------------------------------------
    def field_name(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, reason: str) -> FlowFileError:
        return self.doc.error(self.field_name(name), reason)

    def only(self, *known: str) -> "Params":
        """Refuse any field not in ``known`` (a typo must not pass for a default)."""
        for exc in self.unknown(*known):
            raise exc
        return self

    def unknown(self, *known: str) -> list[FlowFileError]:
        """A refusal for each field not in ``known``, in the file's order (what ``only`` raises first)."""
        return [self.error(k, f"unknown field (known: {', '.join(sorted(known))})") for k in self.value
                if k not in known]

    def has(self, name: str) -> bool:
        return name in self.value

    # -- scalar reads -----------------------------------------------------
    def get(self, name: str, kind: type | tuple, default: Any = _MISSING, check=None, why: str = "") -> Any:
        if name not in self.value:
            if default is _MISSING:
                raise self.error(name, "is required")
            return default
        v = self.value[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.error(name, f"must be a {names} (got {v!r})")
        if check is not None and not check(v):
            raise self.error(name, f"{why} (got {v!r})")
        return v

    def name(self, name: str, default: Any = _MISSING) -> str:
        return self.get(name, str, default, check=lambda v: bool(NAME.fullmatch(v)),
                        why="must be 1-64 letters, digits, '_', '-' or '.'")

    def seconds(self, name: str, default: Any = _MISSING, *, positive: bool = False, maximum: float = 10 * 365 * 86400,
                check: Callable[[float], bool] | None = None, why: str = "") -> float:
        """A duration (``durations.duration_s``: seconds, or text such as ``15m`` or ``7d``) in
        seconds: >= 0 (or > 0 with ``positive``) and at most ``maximum``, or, with ``check``,
        what it accepts (``why`` says what that is)."""
        if name not in self.value:
            if default is _MISSING:
                raise self.error(name, "is required")
            return default if default is None else float(default)
        raw = self.value[name]
        v = duration_s(raw)
        if v is None:
            raise self.error(name, f"must be seconds: {DURATION_FORMS} (got {raw!r})")
        if check is not None:
            if not check(v):
                raise self.error(name, f"{why} (got {raw!r})")
            return v
        lo = "> 0" if positive else ">= 0"
        if not (v > 0 if positive else v >= 0) or v > maximum:
            raise self.error(name, f"must be seconds {lo} and <= {maximum:g} (got {raw!r})")
        return v

    def integer(self, name: str, default: Any = _MISSING, *, minimum: int | None = None) -> int:
        why = f"must be >= {minimum}" if minimum is not None else ""
        return self.get(name, int, default, check=(lambda v: v >= minimum) if minimum is not None else None, why=why)

    def choice(self, name: str, options: Iterable[str], default: Any = _MISSING) -> str:
        options = tuple(options)
        return self.get(name, str, default, check=lambda v: v in options,
                        why=f"must be one of {', '.join(options)}")

    def str_list(self, name: str, default: Any = _MISSING, *, nonempty: bool = True) -> list[str]:
        if name not in self.value and default is not _MISSING:
            return default
        v = self.get(name, list)
        if nonempty and not v:
            raise self.error(name, "must list at least one value")
        for i, item in enumerate(v):
            if not isinstance(item, str) or not item:
                raise self.doc.error(f"{self.field_name(name)}[{i}]", f"must be a non-empty string (got {item!r})")
        return list(v)

    # -- message readers --------------------------------------------------
    def field_path(self, name: str, default: Any = _MISSING) -> FieldPath | None:
        if name not in self.value and default is not _MISSING:
            return default
        text = self.get(name, str)  # its own refusal as it is: a FlowFileError is a ValueError too
        try:
            return FieldPath(text)
        except ValueError as exc:
            raise self.error(name, str(exc)) from None

    def template(self, name: str, default: Any = _MISSING) -> Template | None:
        if name not in self.value and default is not _MISSING:
            return default
        text = self.get(name, str)  # its own refusal as it is: a FlowFileError is a ValueError too
        try:
            return Template(text)
        except ValueError as exc:
            raise self.error(name, str(exc)) from None

    def callable(self, name: str, default: Any = _MISSING) -> Callable | None:
        """A Python callable named ``package.module:function``, imported now."""
        if name not in self.value and default is not _MISSING:
            return default
        v = self.get(name, str)
        module, _, attr = v.partition(":")
        if not module or not attr:
            raise self.error(name, f"must be 'package.module:function' (got {v!r})")
        try:
            target = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise self.error(name, f"cannot import {v!r}: {exc}") from None
        if not callable(target):
            raise self.error(name, f"{v!r} is not callable")
        return target

    # -- nesting ----------------------------------------------------------
    def section(self, name: str, default: dict | None = None) -> "Params":
        if name not in self.value:
            if default is None:
                raise self.error(name, "is required")
            return Params(self.doc, self.field_name(name), default)
        return Params(self.doc, self.field_name(name), self.value[name])

    def sections(self, name: str, default: list | None = None) -> list["Params"]:
        """A list of mappings (e.g. rulesets), each as Params with its index in the path."""
        items = self.get(name, list, default if default is not None else _MISSING)
        return [Params(self.doc, f"{self.field_name(name)}[{i}]", item) for i, item in enumerate(items)]
