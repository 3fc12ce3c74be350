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

from dataclasses import dataclass
from pathlib import Path

from .message import KEY_TYPES, MessageSpec
from .params import NAME, Doc, FlowFileError, Params

__all__ = ["FlowFileError", "FlowSpec", "SortSpec", "ActionSpec", "load_flow", "parse_flow", "read_text"]


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
    batch_bytes: int = 64 << 20        # most body bytes one micro-batch reads
    write_lease: float = 1.0           # a master whose Redis writes fail this long steps down
    wait_replicas: int = 0             # escalate only once WAIT confirms this many replicas
    replica_wait_ms: int = 1000
    redis_checks: str = "refuse"       # refuse or warn on a Redis that cannot keep the promises
    failure_max_entries: int = 100_000
    source: str = "<string>"


def parse_flow(text: str, file: str = "<string>") -> FlowSpec:
    """Validate a cluster flow file's text; raise FlowFileError at the first problem."""
    doc = Doc(text, file)
    top = Params(doc, "", doc.value).only("flow", "uplink", "message", "nodes", "cluster", "failure")
    name = top.name("flow")

    up = top.section("uplink").only("stream", "batch_size", "batch_bytes")
    msg = top.section("message").only("id", "key", "key_type", "max_bytes", "max_depth", "max_number_digits")
    spec = MessageSpec(
        id_path=msg.get("id", str, check=bool, why="must not be empty"),
        key_path=msg.get("key", str, check=bool, why="must not be empty"),
        key_type=msg.choice("key_type", sorted(KEY_TYPES), "int"),
        max_bytes=msg.get("max_bytes", int, 1 << 20, check=lambda v: 1 <= v <= 64 << 20, why="must be 1..67108864"),
        max_depth=msg.get("max_depth", int, 64, check=lambda v: 1 <= v <= 1000, why="must be 1..1000"),
        max_number_digits=msg.get("max_number_digits", int, 100, check=lambda v: 1 <= v <= 4000,
                                  why="must be 1..4000 (Python refuses longer integers)"),
    )

    nodes = top.section("nodes")
    sorts, actions = [], []
    for node_name in nodes.value:
        if not NAME.fullmatch(str(node_name)):
            raise nodes.error(node_name, "a node name must be 1-64 letters, digits, '_', '-' or '.'")
        n = nodes.section(node_name)
        kind = n.value.get("type")
        if kind == "sort":
            n.only("type", "mode", "bake_time", "unclaimed_outlink", "max_pending")
            n.get("mode", str, check=lambda v: v == "claim", why="only 'claim' runs on the cluster so far")
            sorts.append(SortSpec(
                name=node_name,
                bake_time=n.get("bake_time", (int, float), 5.0, check=lambda v: 0 < v <= 86400,
                                why="must be seconds in (0, 86400]") * 1.0,
                unclaimed_outlink=n.get("unclaimed_outlink", str, "done", check=lambda v: v in ("done", "failure"),
                                        why="must be 'done' or 'failure'"),
                max_pending=n.integer("max_pending", 1_000_000, minimum=1),
            ))
        elif kind == "action":
            n.only("type", "sink", "id_ttl")
            actions.append(ActionSpec(
                name=node_name,
                sink_stream=n.section("sink").only("stream").name("stream"),
                id_ttl=n.get("id_ttl", int, 7 * 86400, check=lambda v: v >= 1,
                             why="must be >= 1 second (the ID cache is never unbounded)"),
            ))
        else:
            raise n.error("type", f"must be 'sort' or 'action' (got {kind!r})")
    if len(sorts) != 1 or len(actions) != 1:
        raise top.error("nodes", f"a cluster flow needs exactly one sort and one action node "
                                 f"(got {len(sorts)} and {len(actions)})")

    cl = top.section("cluster", default={}).only(
        "session_timeout", "escalation_batch", "write_lease", "wait_replicas", "replica_wait_ms", "redis_checks")
    session_timeout = cl.get("session_timeout", (int, float), 2.0, check=lambda v: 1 <= v <= 60,
                             why="must be seconds in [1, 60]") * 1.0
    batch_bytes = up.get("batch_bytes", int, 64 << 20, check=lambda v: 1 << 20 <= v <= 256 << 20,
                         why="must be 1048576..268435456 (1-256 MiB)")
    if batch_bytes < spec.max_bytes:
        raise up.error("batch_bytes", f"must be at least message.max_bytes ({spec.max_bytes}): "
                                      f"a message of the largest allowed size must fit in a batch")
    failure = top.section("failure", default={}).only("max_entries")
    return FlowSpec(
        name=name,
        uplink_stream=up.name("stream"),
        batch_size=up.get("batch_size", int, 2000, check=lambda v: 1 <= v <= 100_000, why="must be 1..100000"),
        message=spec,
        sort=sorts[0],
        action=actions[0],
        session_timeout=session_timeout,
        escalation_batch=cl.get("escalation_batch", int, 500, check=lambda v: 1 <= v <= 10_000, why="must be 1..10000"),
        batch_bytes=batch_bytes,
        write_lease=cl.get("write_lease", (int, float), session_timeout / 2,
                           check=lambda v: 0.2 <= v < session_timeout,
                           why=f"must be seconds in [0.2, session_timeout = {session_timeout})") * 1.0,
        wait_replicas=cl.integer("wait_replicas", 0, minimum=0),
        replica_wait_ms=cl.integer("replica_wait_ms", 1000, minimum=1),
        redis_checks=cl.choice("redis_checks", ["refuse", "warn"], "refuse"),
        failure_max_entries=failure.integer("max_entries", 100_000, minimum=100),
        source=file,
    )


def read_text(path: str | Path) -> str:
    """A flow file's text, or FlowFileError when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise FlowFileError(str(path), None, "(file)", f"cannot be read: {exc.strerror}") from None


def load_flow(path: str | Path) -> FlowSpec:
    """Read and validate a flow file; FlowFileError names what is wrong and where."""
    return parse_flow(read_text(path), str(path))
