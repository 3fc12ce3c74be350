"""The flow file's ``streams`` section: how long each stream the flow writes keeps its entries.

::

    streams:
      max_entries: 1000000      # every stream the flow writes, unless overridden (null: no count bound)
      retention: 7d             # seconds, or a number with s, m, h or d (null: no age bound)
      overrides:                # per stream: its name, or <node>.<outlink> for an outlink's
        sink: {max_entries: 5000000, retention: 30d}
        guard.duplicate: {retention: 1d}
        failure: {retention: 2d}

The streams a flow writes on the cluster are its outlinks' (an action's ``done`` goes to its
sink, ``sink.stream``; any other unlinked outlink to ``out:<node>:<outlink>``), the failure
stream ``failure`` and the publishers' notices ``notices``. The master trims each of them in
its trim round to at most ``max_entries`` entries and to none older than ``retention``
(``runtime/store/stream_retention.py``), counting what it removed that a consumer group had
not read. The uplink has its own retention (``uplink.retention``, trimmed only behind every
reader) and so has the audit (``audit``). The failure and notice streams are also capped as
they are written (``failure.max_entries``, ``notices.max_entries``); their count here is the
smaller of that cap and this section's.

The defaults, a million entries and seven days, keep a consumer that stops for a weekend from
losing anything at moderate rates while bounding every stream: no stream grows without bound
unless a flow file says so for one bound, and never for both.

Under failure: nothing here touches a server. A value that cannot be used is refused at load
with FlowFileError naming the file, line, field and reason.

>>> from twinflow.runtime.params import Doc, Params
>>> doc = Doc("streams: {retention: 2d, overrides: {sink: {max_entries: 10}}}\\n", "f.yaml")
>>> spec = read_streams(Params(doc, "", doc.value), {"sink": "sink", "failure": "failure"})
>>> spec.of("sink"), spec.of("failure", cap=100)
(Retention(max_entries=10, retention=172800.0), Retention(max_entries=100, retention=172800.0))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .durations import FORMS, duration_s
from .nodes.action import ActionNode
from .nodes.base import Node
from .params import Params

__all__ = ["Retention", "StreamsSpec", "read_streams", "outlink_stream", "written_streams"]

DEFAULT_MAX_ENTRIES = 1_000_000
DEFAULT_RETENTION_S = 7 * 86400.0
MAX_ENTRIES = 100_000_000
MIN_RETENTION_S = 60.0
MAX_RETENTION_S = 3650 * 86400.0
FAILURE, NOTICES = "failure", "notices"


@dataclass(frozen=True)
class Retention:
    """One stream's bounds: at most ``max_entries`` entries, none older than ``retention``
    seconds; None: no bound of that kind (never both)."""

    max_entries: int | None = DEFAULT_MAX_ENTRIES
    retention: float | None = DEFAULT_RETENTION_S


@dataclass(frozen=True)
class StreamsSpec:
    """The ``streams`` section: the default bounds and each overridden stream's."""

    default: Retention = Retention()
    overrides: tuple[tuple[str, Retention], ...] = ()   # (stream name, its bounds)

    def of(self, stream: str, cap: int | None = None) -> Retention:
        """The bounds of ``stream`` (its name, such as ``sink`` or ``out:guard:failure``); ``cap``:
        a count the stream is held to anyway (the failure and notice streams' own caps)."""
        bounds = dict(self.overrides).get(stream, self.default)
        if cap is not None and (bounds.max_entries is None or cap < bounds.max_entries):
            return Retention(cap, bounds.retention)
        return bounds


def outlink_stream(name: str, node: Node, outlink: str) -> str:
    """The stream's name (under the flow's key prefix) that ``node``'s unlinked ``outlink`` writes
    to on the cluster: an action's ``done`` to its sink, any other to ``out:<node>:<outlink>``."""
    sink = node.sink if isinstance(node, ActionNode) and outlink == "done" else None
    return sink or f"out:{name}:{outlink}"


def written_streams(nodes: Mapping[str, Node], links: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Every stream the flow writes, by each name a flow file or an operator may give it (the
    stream's own, and ``<node>.<outlink>`` for an outlink's) -> the stream's name."""
    names = {FAILURE: FAILURE, NOTICES: NOTICES}
    for name, node in nodes.items():
        for outlink in node.outlinks:
            if outlink not in links.get(name, {}):
                stream = outlink_stream(name, node, outlink)
                names.setdefault(stream, stream)
                names[f"{name}.{outlink}"] = stream
    return names


def read_streams(top: Params, written: Mapping[str, str] | None) -> StreamsSpec:
    """The ``streams`` section (defaults when it is absent). ``written``: the names of the streams
    the flow writes (:func:`written_streams`), or None when they are unknown (a node was refused):
    then an override's name is not checked."""
    sec = top.section("streams", default={})
    default = _bounds(sec, Retention(), ("max_entries", "retention", "overrides"))
    overrides: dict[str, Retention] = {}
    named: dict[str, str] = {}  # stream -> the name that overrode it
    over = sec.section("overrides", default={})
    for name in over.value:
        stream = str(name)
        if written is not None:
            if stream not in written:
                known = ", ".join(sorted(set(written.values())))
                raise over.error(stream, f"is not a stream this flow writes (its streams: {known}; an "
                                         f"outlink's is also named <node>.<outlink>)")
            stream = written[stream]
            if stream in named:
                raise over.error(name, f"names stream {stream!r}, which {named[stream]!r} names too")
        named[stream] = str(name)
        overrides[stream] = _bounds(over.section(name), default)
    return StreamsSpec(default, tuple(overrides.items()))


def _bounds(sec: Params, inherit: Retention, known: tuple[str, ...] = ("max_entries", "retention")) -> Retention:
    """``max_entries`` and ``retention`` of ``sec``, each inherited from ``inherit`` when absent."""
    sec.only(*known)
    max_entries, retention = inherit.max_entries, inherit.retention
    if sec.has("max_entries"):
        max_entries = None if sec.value["max_entries"] is None else sec.get(
            "max_entries", int, check=lambda v: 1 <= v <= MAX_ENTRIES,
            why=f"must be 1..{MAX_ENTRIES}, or null for no count bound")
    if sec.has("retention"):
        raw = sec.value["retention"]
        retention = None if raw is None else duration_s(raw)
        if raw is not None and (retention is None or not MIN_RETENTION_S <= retention <= MAX_RETENTION_S):
            raise sec.error("retention", f"must be {FORMS}, in [60 s, 3650 d], or null for no age bound "
                                         f"(got {raw!r})")
    if max_entries is None and retention is None:
        raise sec.error("max_entries" if sec.has("max_entries") else "retention",
                        "max_entries and retention cannot both be null: the stream would grow without bound")
    return Retention(max_entries, retention)
