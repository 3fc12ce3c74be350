"""Flow files: YAML that says what a flow reads, which nodes it runs and where results go.

``load_flow(path)`` validates the whole file before anything starts and
raises :class:`FlowFileError` naming the file, the line, the field and the
reason at the first problem; it never returns a half-valid flow.

The active-active cluster flow (see README "Flow files") has one claim-mode
``sort`` node, run by the worker, and one ``action`` node, run by the master::

    flow: demo
    uplink: {stream: uplink}
    message: {id: id, key: seq, key_type: int}
    nodes:
      sort:    {type: sort, mode: claim, bake_time: 5.0, unclaimed_outlink: done}
      deliver: {type: action, sink: {stream: sink}, id_ttl: 86400}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .message import KEY_TYPES, MessageSpec

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class FlowFileError(ValueError):
    def __init__(self, file: str, line: int | None, field: str, reason: str):
        self.file, self.line, self.field, self.reason = file, line, field, reason
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {reason}")


@dataclass(frozen=True)
class SortSpec:
    name: str
    bake_time: float
    unclaimed_outlink: str
    max_pending: int


@dataclass(frozen=True)
class ActionSpec:
    name: str
    sink_stream: str
    id_ttl: int


@dataclass(frozen=True)
class FlowSpec:
    name: str
    uplink_stream: str
    batch_size: int
    message: MessageSpec
    sort: SortSpec
    action: ActionSpec
    session_timeout: float
    escalation_batch: int
    source: str = "<string>"


class _Doc:
    """Plain Python values plus the line of every field path, from one YAML text."""

    def __init__(self, text: str, file: str):
        self.file = file
        self.lines: dict[str, int] = {}
        try:
            root = yaml.compose(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise FlowFileError(file, mark.line + 1 if mark else None, "(file)", f"not valid YAML: {exc}") from None
        if root is None:
            raise FlowFileError(file, None, "(file)", "the file is empty")
        self.value = self._plain(root, "")

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


class _Section:
    """Typed reads of one mapping, each failure naming the full field path."""

    def __init__(self, doc: _Doc, path: str, value: Any, known: set[str]):
        self.doc, self.path = doc, path
        if not isinstance(value, dict):
            raise doc.error(path or "(file)", "must be a mapping")
        self.value = value
        for k in value:
            if k not in known:
                raise doc.error(self._p(k), f"unknown field (known: {', '.join(sorted(known))})")

    def _p(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, kind: type | tuple, default: Any = ..., check=None, why: str = "") -> Any:
        if name not in self.value:
            if default is ...:
                raise self.doc.error(self._p(name), "is required")
            return default
        v = self.value[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.doc.error(self._p(name), f"must be a {names} (got {v!r})")
        if check is not None and not check(v):
            raise self.doc.error(self._p(name), f"{why} (got {v!r})")
        return v

    def section(self, name: str, known: set[str], default: dict | None = None) -> "_Section":
        if name not in self.value and default is not None:
            return _Section(self.doc, self._p(name), default, known)
        if name not in self.value:
            raise self.doc.error(self._p(name), "is required")
        return _Section(self.doc, self._p(name), self.value[name], known)


def _name(v: str) -> bool:
    return bool(NAME.match(v))


def parse_flow(text: str, file: str = "<string>") -> FlowSpec:
    """Validate a flow file's text; raise FlowFileError at the first problem."""
    doc = _Doc(text, file)
    top = _Section(doc, "", doc.value, {"flow", "uplink", "message", "nodes", "cluster"})
    name = top.get("flow", str, check=_name, why="must be 1-64 letters, digits, '_', '-' or '.'")

    up = top.section("uplink", {"stream", "batch_size"})
    stream = up.get("stream", str, check=_name, why="must be 1-64 letters, digits, '_', '-' or '.'")
    batch = up.get("batch_size", int, 2000, check=lambda v: 1 <= v <= 100_000, why="must be 1..100000")

    msg = top.section("message", {"id", "key", "key_type", "max_bytes"})
    spec = MessageSpec(
        id_path=msg.get("id", str, check=bool, why="must not be empty"),
        key_path=msg.get("key", str, check=bool, why="must not be empty"),
        key_type=msg.get("key_type", str, "int", check=lambda v: v in KEY_TYPES, why=f"must be one of {sorted(KEY_TYPES)}"),
        max_bytes=msg.get("max_bytes", int, 1 << 20, check=lambda v: 1 <= v <= 64 << 20, why="must be 1..67108864"),
    )

    nodes = top.get("nodes", dict)
    sorts, actions = [], []
    for node_name in nodes:
        path = f"nodes.{node_name}"
        if not _name(str(node_name)):
            raise doc.error(path, "a node name must be 1-64 letters, digits, '_', '-' or '.'")
        raw = nodes[node_name]
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "sort":
            n = _Section(doc, path, raw, {"type", "mode", "bake_time", "unclaimed_outlink", "max_pending"})
            n.get("mode", str, check=lambda v: v == "claim", why="only 'claim' runs on the cluster so far")
            sorts.append(SortSpec(
                name=node_name,
                bake_time=float(n.get("bake_time", (int, float), 5.0, check=lambda v: 0 < v <= 86400, why="must be seconds in (0, 86400]")),
                unclaimed_outlink=n.get("unclaimed_outlink", str, "done", check=lambda v: v in ("done", "failure"), why="must be 'done' or 'failure'"),
                max_pending=n.get("max_pending", int, 1_000_000, check=lambda v: v >= 1, why="must be >= 1"),
            ))
        elif kind == "action":
            n = _Section(doc, path, raw, {"type", "sink", "id_ttl"})
            sink = n.section("sink", {"stream"})
            actions.append(ActionSpec(
                name=node_name,
                sink_stream=sink.get("stream", str, check=_name, why="must be 1-64 letters, digits, '_', '-' or '.'"),
                id_ttl=n.get("id_ttl", int, 7 * 86400, check=lambda v: v >= 1, why="must be >= 1 second (the ID cache is never unbounded)"),
            ))
        else:
            raise doc.error(f"{path}.type", f"must be 'sort' or 'action' (got {kind!r})")
    if len(sorts) != 1 or len(actions) != 1:
        raise doc.error("nodes", f"a cluster flow needs exactly one sort and one action node (got {len(sorts)} and {len(actions)})")

    cl = top.section("cluster", {"session_timeout", "escalation_batch"}, default={})
    return FlowSpec(
        name=name,
        uplink_stream=stream,
        batch_size=batch,
        message=spec,
        sort=sorts[0],
        action=actions[0],
        session_timeout=float(cl.get("session_timeout", (int, float), 2.0, check=lambda v: 1 <= v <= 60, why="must be seconds in [1, 60]")),
        escalation_batch=cl.get("escalation_batch", int, 500, check=lambda v: 1 <= v <= 10_000, why="must be 1..10000"),
        source=file,
    )


def load_flow(path: str | Path) -> FlowSpec:
    """Read and validate a flow file; FlowFileError names what is wrong and where."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise FlowFileError(str(p), None, "(file)", f"cannot be read: {exc.strerror}") from None
    return parse_flow(text, str(p))
