"""What a flow file says about running on the cluster: the uplink, the claim pair, the limits.

These sections sit in the same flow file as the graph (``runtime/flowgraph.py``)
and ``twinflow replay`` ignores them; ``twinflow run`` needs ``uplink``::

    flow: demo
    uplink: {stream: uplink, batch_size: 2000}
    message: {id: id, id_ttl: 604800}
    input: deliver
    nodes:
      deliver: {type: action, sink: {stream: sink}}
      claims:                      # the worker's half of the claim pair
        type: sort
        pairs_with: deliver        # same uplink; on each node exactly one of the two runs
        key: seq                   # the short form: one ruleset; or rulesets, as the sort node takes
        bake_time: 5.0
    cluster: {session_timeout: 2.0}
    failure: {max_entries: 100000}
    audit: {retention: 7d, max_entries: 100000}   # failed messages kept for an operator (audit_spec.py)
    notices: {outlinks: [deliver.failure]}        # failures a publisher is told of, besides an action's error
    streams: {max_entries: 1000000, retention: 7d}  # bounds of every stream the flow writes (stream_spec.py)
    security:                      # gRPC between nodes and clients (docs/operations/security.md)
      tls: {cert: certs/node.pem, key: certs/node-key.pem, ca: certs/ca.pem, mutual: true}
      tokens: {ingest: "env:TF_INGEST", escalation: "file:/etc/twinflow/escalation", admin: "file:/etc/twinflow/admin"}

The claim pair is optional. With it, the worker bakes every uplink message in
the paired sort until the master's escalation claims it; without it, the
worker only tracks how far it has read. Either way a promoted worker
re-reads the uplink after the flow's processed mark (promise 1, docs/concepts/promises.md),
so the pair surfaces a master that falls behind but is not what keeps
messages from being lost.

A bad section raises FlowFileError naming the file, line, field and reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from .audit_spec import AuditSpec, NoticeSpec, read_audit, read_notices
from .sort_keys import KEY_TYPES
from .message import MessageSpec
from .nodes.sort import read_outlink_names, read_rulesets, read_xa_mode
from .nodes.sort.claim_rules import ClaimRules
from .params import Params, Refusals
from .stream_spec import StreamsSpec, read_streams

__all__ = ["ClusterSpec", "ClaimPair", "SecuritySpec", "parse_cluster"]

# read is optional: the token of an operator who may look but not act (twinflow/grpc_security.py).
TOKEN_SCOPES = ("ingest", "escalation", "admin", "read")

# The most messages one master step (one COMMIT script) may hold: the store's own cut,
# ``flow_store.DELIVER_MAX_MESSAGES`` (the pure core does not import the store to read it).
MAX_STEP_MESSAGES = 1000


@dataclass(frozen=True)
class ClaimPair:
    """The worker's claim-mode sort and the master's action it pairs with.

    ``rules`` are its rulesets (the short form's one ruleset ``all`` too); ``names`` its own
    names for the outlinks done, bypass, failure and nohit, in that order."""

    sort: str
    action: str
    rules: ClaimRules
    unclaimed_outlink: str
    max_pending: int
    names: tuple[str, str, str, str] = ("done", "bypass", "failure", "nohit")

    @property
    def bake_time(self) -> float:
        """The longest bake of its rulesets: how long a message may wait for its claim."""
        return max(self.rules.bake_times().values())

    def outlink_name(self, outlink: str) -> str:
        """The flow file's name for one of the sort's four outlinks (done, bypass, failure, nohit)."""
        return self.names[("done", "bypass", "failure", "nohit").index(outlink)]


@dataclass(frozen=True)
class SecuritySpec:
    """The flow file's ``security`` section: TLS file paths and token references, unread.

    Paths are resolved against the flow file's folder; tokens are secret
    references (``file:PATH`` or ``env:NAME``), read only when a node or a
    client starts (``twinflow.grpc_security``), never values.
    """

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_mutual: bool = False
    tls_server_name: str | None = None
    tokens: tuple[tuple[str, str], ...] = ()   # (scope, secret reference)


@dataclass(frozen=True)
class ClusterSpec:
    uplink_stream: str
    batch_size: int                    # a batch's entries under light load ...
    message: MessageSpec
    pair: ClaimPair | None
    session_timeout: float = 2.0
    escalation_batch: int = 500
    batch_bytes: int = 64 << 20        # most body bytes one micro-batch reads
    max_batch_size: int = 20_000       # ... and under a backlog (the source's "Admission")
    retention: float = 3600.0          # seconds an uplink entry is kept at least (then trimmed once safe)
    write_lease: float = 1.0           # a master whose Redis writes fail this long steps down
    wait_replicas: int = 0             # escalate only once WAIT confirms this many replicas
    replica_wait_ms: int = 1000
    redis_checks: str = "refuse"       # refuse or warn on a Redis that cannot keep the promises
    failure_max_entries: int = 100_000
    shards: int = 1                    # uplink shards (runtime/shards.py), each a pair of its own
    shard_key: str | None = None       # the template that assigns a message to a shard
    # Most messages per master step (one COMMIT); a batch larger takes several steps.
    # Smaller steps: a shorter COMMIT each (Redis blocks less per script), more round trips.
    step_messages: int = MAX_STEP_MESSAGES
    security: SecuritySpec = SecuritySpec()
    audit: AuditSpec = AuditSpec()      # the failed messages' audit: retention and size
    notices: NoticeSpec = NoticeSpec()  # the outlinks that give publishers notices
    streams: StreamsSpec = StreamsSpec()  # how long each stream the flow writes keeps its entries

    @property
    def max_pending(self) -> int:
        return self.pair.max_pending if self.pair else 1_000_000


def read_message(top: Params) -> MessageSpec:
    """The ``message`` section: where the ID is, how long it is remembered, how large a body may be."""
    msg = top.section("message", default={}).only("id", "id_ttl", "max_bytes", "max_depth", "max_number_digits")
    return MessageSpec(
        id_path=msg.get("id", str, "id", check=bool, why="must not be empty"),
        id_ttl=msg.get("id_ttl", int, 7 * 86400, check=lambda v: v >= 1,
                       why="must be >= 1 second (the ID cache is never unbounded)"),
        max_bytes=msg.get("max_bytes", int, 1 << 20, check=lambda v: 1 <= v <= 64 << 20, why="must be 1..67108864"),
        max_depth=msg.get("max_depth", int, 64, check=lambda v: 1 <= v <= 1000, why="must be 1..1000"),
        max_number_digits=msg.get("max_number_digits", int, 100, check=lambda v: 1 <= v <= 4000,
                                  why="must be 1..4000 (Python refuses longer integers)"),
    )


# Replay's claim-mode sort options that the pair has no place for, each with where the cluster
# keeps what it says (a user porting a replay flow is told, not handed "unknown field").
REPLAY_SORT_ONLY = {
    "id_ttl": "has no place on the claim pair: the flow's message.id_ttl keeps the cluster's ID cache",
    "rollback_on": "has no place on the claim pair: on the cluster a promotion is the rollback",
}


def read_pair(sort: Params, kinds: dict[str, str], message: MessageSpec) -> ClaimPair:
    """A sort node's section with ``pairs_with``: the worker's half of the claim pair.

    Either ``rulesets`` as the sort node takes them (``runtime/nodes/sort``), or the short
    form, ``key`` (a field path) and ``bake_time``: one baking ruleset, ``all``, whose claim ID
    is the message ID."""
    for field, reason in REPLAY_SORT_ONLY.items():
        if sort.has(field):
            raise sort.error(field, reason)
    sort.only("type", "pairs_with", "key", "key_type", "bake_time", "unclaimed_outlink", "max_pending",
              "rulesets", "xa_mode", "outlinks")
    action = sort.get("pairs_with", str, check=lambda v: kinds.get(v) == "action",
                      why="must name an action node of this flow")
    key_type = sort.choice("key_type", KEY_TYPES, "int")
    if sort.has("rulesets"):
        for short in ("key", "bake_time"):
            if sort.has(short):
                raise sort.error(short, "only without rulesets (each ruleset has its own key and bake_time)")
        rules = ClaimRules(tuple(read_rulesets(sort, key_type, pair=True)), key_type, message.max_number_digits,
                           message.id_path)
    else:
        key = sort.get("key", str, check=bool, why="must not be empty")
        bake_time = sort.seconds("bake_time", 5.0, check=lambda v: 0 < v <= 86400, why="must be seconds in (0, 86400]")
        rules = ClaimRules.short_form(key, key_type, message.id_path, bake_time, message.max_number_digits)
        read_xa_mode(sort)
    return ClaimPair(
        sort=sort.path.rpartition(".")[2],
        action=action,
        rules=rules,
        unclaimed_outlink=sort.choice("unclaimed_outlink", ("done", "failure"), "done"),
        max_pending=sort.integer("max_pending", 1_000_000, minimum=1),
        names=read_outlink_names(sort),
    )


CLUSTER_SECTIONS = ("cluster", "failure", "security", "audit", "notices", "streams")


def parse_cluster(top: Params, message: MessageSpec, pair: ClaimPair | None,
                  outlinks: Mapping[str, tuple[str, ...] | None] | None = None,
                  links: dict[str, dict[str, str]] | None = None,
                  refusals: Refusals | None = None,
                  written: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """The cluster sections of a flow file, or None when it has no ``uplink`` (replay only).
    ``outlinks`` (each node's; None: a node refused, not checked against) and ``links`` (the
    graph's) check the ``notices`` section, ``written`` (``stream_spec.written_streams``; None:
    unknown) the ``streams`` section. Each section is read on its own: ``refusals`` raises the
    first refusal, or collects one per section (then the result is None)."""
    r = refusals or Refusals()
    for section in CLUSTER_SECTIONS:
        if top.has(section) and not top.has("uplink"):
            r.add(top.error(section, "only with an uplink section (the flow runs on the cluster)"))
    if not top.has("uplink"):
        if pair is not None:
            r.add(top.error("uplink", f"is required: node {pair.sort!r} pairs with {pair.action!r}, "
                                      f"which only means something on the cluster"))
        return None
    if pair is not None:
        message = replace(message, key_path=None, key_type=pair.rules.key_type, rules=pair.rules)
    before = len(r.found)
    fields: dict = {"message": message, "pair": pair}
    for read in (lambda: _read_uplink(top, message), lambda: _read_cluster(top),
                 lambda: {"failure_max_entries": top.section("failure", default={}).only("max_entries")
                          .integer("max_entries", 100_000, minimum=100)},
                 lambda: {"security": read_security(top)}, lambda: {"audit": read_audit(top)},
                 lambda: {"notices": read_notices(top, outlinks or {}, links or {})},
                 lambda: {"streams": read_streams(top, written)}):
        with r.unit():
            fields.update(read())
    return None if len(r.found) > before else ClusterSpec(**fields)


def _read_uplink(top: Params, message: MessageSpec) -> dict:
    """The ``uplink`` section: the stream, the batches' bounds, the retention, the shards."""
    up = top.section("uplink").only("stream", "batch_size", "max_batch_size", "batch_bytes", "retention",
                                    "shards", "shard_key")
    batch_bytes = up.get("batch_bytes", int, 64 << 20, check=lambda v: 1 << 20 <= v <= 256 << 20,
                         why="must be 1048576..268435456 (1-256 MiB)")
    if batch_bytes < message.max_bytes:
        raise up.error("batch_bytes", f"must be at least message.max_bytes ({message.max_bytes}): "
                                      f"a message of the largest allowed size must fit in a batch")
    batch_size = up.get("batch_size", int, 2000, check=lambda v: 1 <= v <= 100_000, why="must be 1..100000")
    max_batch_size = up.get("max_batch_size", int, max(batch_size, 20_000),
                            check=lambda v: batch_size <= v <= 1_000_000,
                            why=f"must be batch_size ({batch_size})..1000000")
    shards = up.get("shards", int, 1, check=lambda v: 1 <= v <= 256, why="must be 1..256")
    shard_key = up.template("shard_key", None)
    if shards > 1 and shard_key is None:
        raise up.error("shard_key", f"is required with shards: {shards} (a template such as '{{customer}}'; "
                                    f"messages that meet in a join, history or sequence must share a shard)")
    return dict(
        shards=shards,
        shard_key=shard_key.template if shard_key else None,
        uplink_stream=up.name("stream"),
        batch_size=batch_size,
        max_batch_size=max_batch_size,
        retention=up.seconds("retention", 3600.0, check=lambda v: 0 <= v <= 365 * 86400,
                             why="must be seconds in [0, 31536000]"),
        batch_bytes=batch_bytes,
    )


def _read_cluster(top: Params) -> dict:
    """The ``cluster`` section: the ZooKeeper session, the write lease, escalation, replicas, steps."""
    cl = top.section("cluster", default={}).only(
        "session_timeout", "escalation_batch", "write_lease", "wait_replicas", "replica_wait_ms", "redis_checks",
        "step_messages")
    session_timeout = cl.seconds("session_timeout", 2.0, check=lambda v: 1 <= v <= 60, why="must be seconds in [1, 60]")
    return dict(
        session_timeout=session_timeout,
        escalation_batch=cl.get("escalation_batch", int, 500, check=lambda v: 1 <= v <= 10_000,
                                why="must be 1..10000"),
        write_lease=cl.seconds("write_lease", session_timeout / 2, check=lambda v: 0.2 <= v < session_timeout,
                               why=f"must be seconds in [0.2, session_timeout = {session_timeout})"),
        wait_replicas=cl.integer("wait_replicas", 0, minimum=0),
        replica_wait_ms=cl.integer("replica_wait_ms", 1000, minimum=1),
        redis_checks=cl.choice("redis_checks", ["refuse", "warn"], "refuse"),
        step_messages=cl.get("step_messages", int, MAX_STEP_MESSAGES,
                             check=lambda v: 1 <= v <= MAX_STEP_MESSAGES,
                             why=f"must be 1..{MAX_STEP_MESSAGES} (messages per master step)"),
    )


def read_security(top: Params) -> SecuritySpec:
    """The ``security`` section (TLS files relative to the flow file, token references)."""
    sec = top.section("security", default={}).only("tls", "tokens")
    tls = sec.section("tls", default={}).only("cert", "key", "ca", "mutual", "server_name")
    base = Path(top.doc.file).parent if top.doc.file and not top.doc.file.startswith("<") else Path(".")

    def path(name: str) -> str | None:
        value = tls.get(name, str, None, check=bool, why="must be a file path")
        return None if value is None else str(base / value)

    cert, key = path("cert"), path("key")
    if (cert is None) != (key is None):
        raise tls.error("key" if key is None else "cert", "is required with tls.cert and tls.key together")
    mutual = tls.get("mutual", bool, False)
    ca = path("ca")
    if mutual and ca is None:
        raise tls.error("ca", "is required with mutual: true (it signs the other nodes' certificates)")
    tokens = sec.section("tokens", default={}).only(*TOKEN_SCOPES)
    refs = []
    for scope in TOKEN_SCOPES:
        if tokens.has(scope):
            ref = tokens.value[scope]
            kind, _, where = ref.partition(":") if isinstance(ref, str) else ("", "", "")
            if kind not in ("file", "env") or not where:
                # The error never repeats the value: it may be the token itself.
                raise tokens.error(scope, "must name the secret as file:PATH or env:NAME, never hold it")
            if kind == "file" and not Path(where).is_absolute():
                ref = f"file:{base / where}"  # like the TLS files: relative to the flow file
            refs.append((scope, ref))
    return SecuritySpec(tls_cert=cert, tls_key=key, tls_ca=ca, tls_mutual=mutual,
                        tls_server_name=tls.get("server_name", str, None), tokens=tuple(refs))
