"""A flow's shared state in Redis: uplink, sink, ID cache, processed mark, failures, epochs, peer status.

Every key of flow ``F`` starts with ``tf:{F}:`` (one hash slot per flow).

:class:`FlowStore` is built from parts: every call goes through the retrying call of
``redis_calls.py`` (waiting, deadlines, following the flow's primary), every write that must
survive a Redis failover through the durable write of ``durable.py``, the uplink is
``uplink_access.py``, a flow's suspensions ``suspensions.py``, its events stream
``flow_events.py``, and this module holds the rest: start-up checks, epochs, the master's
fenced step, the ID cache and read positions, failure records and peer status. What its
calls raise is in ``store_errors.py``.

Under failure: a call waits for Redis up to its deadline (``redis_calls.py``) and never
drops a write silently. Retrying a write is safe even when Redis applied it and only the
reply was lost: a master step carries a marker unique to it and is applied once (a step applied
twice would deliver its messages twice), failure records are keyed by uplink
position, epochs and status are set, not added. A re-sent ``publish`` may append a body
twice; the ID cache skips the second. A delivery from a writer whose epoch is older than the
newest raises :class:`Fenced` and changes nothing. The master's writes carry a deadline (its
write lease, shorter than its ZooKeeper session) so that a master cut off from Redis gives
up the role instead of holding it while it waits.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable

import redis

from ..json_text import compact, loads
from ..message import Message
from ..positions import position_order
from . import scripts
from .change_log import ChangesRead, LogEntry, parse_entry
from .flow_keys import FlowKeys
from .durable import DurableWrites
from .flow_events import FlowEvents
from .redis_calls import DEFAULT_CALL_DEADLINE_S, RedisCalls
from .store_errors import Fenced, GuessWrong, StaleState
from .suspensions import Suspensions
from .uplink_access import UplinkAccess

if TYPE_CHECKING:
    from .step import Step

SURFACED = "surfaced"  # the claim pair's notice that a message baked fully without a claim
DELIVER_MAX_MESSAGES = 1000      # per delivery script: keeps each script short
DELIVER_MAX_BYTES = 16 << 20     # per delivery script: far below Redis's 1 GiB query buffer


def chunked(messages: list[Message], max_count: int = DELIVER_MAX_MESSAGES,
            max_bytes: int = DELIVER_MAX_BYTES) -> Iterable[list[Message]]:
    """Split ``messages`` (in order) into chunks of at most ``max_count`` messages and
    ``max_bytes`` of bodies; a single larger message is a chunk of its own."""
    chunk: list[Message] = []
    size = 0
    for m in messages:
        n = len(m.body)
        if chunk and (len(chunk) >= max_count or size + n > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(m)
        size += n
    if chunk:
        yield chunk


class FlowStore(RedisCalls, DurableWrites, UplinkAccess, Suspensions, FlowEvents):
    """Typed, retrying access to one flow's Redis state."""

    def __init__(
        self,
        client: redis.Redis,
        keys: FlowKeys,
        peer_id: str,
        *,
        id_ttl: int = 7 * 86400,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        call_deadline_s: float = DEFAULT_CALL_DEADLINE_S,
    ):
        self.keys = keys
        self.call_deadline_s = call_deadline_s
        self.peer_id = peer_id
        self.id_ttl = id_ttl
        self._calls_through(client, sleep, monotonic)
        self.epoch_seen = 0  # the newest fencing epoch this store read or set (for the log)

    # -- start-up checks --------------------------------------------------
    def config_problems(self) -> list[str]:
        """What in this Redis's configuration can break the promises (empty: none found).

        The ID cache and the processed mark must never be evicted, and the
        epoch and the mark must survive a restart. A Redis that refuses
        CONFIG (a managed service) is reported as unverifiable.
        """
        try:
            conf = self.call("CONFIG GET", lambda: {
                **self.r.config_get("maxmemory-policy"), **self.r.config_get("appendonly"),
                **self.r.config_get("save")})
        except redis.ResponseError as exc:
            return [f"cannot read the Redis configuration to check it ({exc})"]
        conf = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in conf.items()}
        problems = []
        policy = conf.get("maxmemory-policy", "")
        if policy != "noeviction":
            problems.append(f"maxmemory-policy is {policy!r}: Redis may evict ID-cache keys and the "
                            f"processed mark (set it to 'noeviction')")
        if conf.get("appendonly") != "yes" and not conf.get("save"):
            problems.append("persistence is off (appendonly no, no save points): a Redis restart loses "
                            "the fencing epoch, the ID cache and the processed mark")
        return problems

    # -- epochs -----------------------------------------------------------
    def raise_epoch(self, epoch: int, deadline_s: float | None = None, *, replicas: int = 0,
                    replica_wait_ms: int = 1000) -> int:
        """Make ``epoch`` the fencing epoch unless a newer one exists; returns the one in force.

        With ``replicas`` > 0 (``cluster.wait_replicas``) it returns only once that many
        replicas have the epoch (``durable.py``), as a COMMIT does, else raises
        RedisUnavailable at ``deadline_s``: a Redis failover right after a promotion
        cannot bring back the old epoch, under which the old master's COMMITs would pass.
        """
        def write(pipe):
            scripts.queue(pipe, self.scripts["raise_epoch"], [self.keys.epoch], [epoch])

        (raised,) = self.write_durably("raise_epoch", write, deadline_s, replicas=replicas, wait_ms=replica_wait_ms)
        in_force = int(raised)
        self.epoch_seen = max(self.epoch_seen, in_force)
        return in_force

    def current_epoch(self, deadline_s: float | None = None) -> int:
        epoch = int(self.call("current_epoch", lambda: self.r.get(self.keys.epoch), deadline_s) or 0)
        self.epoch_seen = max(self.epoch_seen, epoch)
        return epoch

    # -- master: one fenced step ------------------------------------------
    def commit(self, epoch: int, step: "Step", *, deadline_s: float | None = None,
               replicas: int = 0, replica_wait_ms: int = 1000,
               guess: tuple[str | None] | None = None) -> None:
        """Write one master step atomically, fenced by ``epoch`` (see scripts.COMMIT).

        Raises Fenced if ``epoch`` is stale (nothing written), RedisUnavailable
        past ``deadline_s``, StaleState when ``step.version`` is not the state
        version in Redis, GuessWrong when one of the step's IDs is processed
        already (both: nothing written). With ``replicas`` > 0 it returns only once that
        many replicas have it (``durable.py``), so a Redis failover cannot erase
        what the caller escalates next. With ``guess`` (the processed mark the
        caller assumes, in a 1-tuple) it raises GuessWrong, nothing written,
        unless the mark is that and none of the step's IDs is processed.
        """
        if step.empty():
            return
        # One token per step: a retry after a lost reply finds the step applied (scripts.COMMIT).
        keys, args = step.script_call(epoch, self.keys, self.id_ttl, f"{self.peer_id}-{uuid.uuid4().hex}",
                                      guess)

        def write(pipe):
            scripts.queue(pipe, self.scripts["commit"], keys, args)

        def refused(replies):
            res = replies[0]
            if int(res[0]) == -1:
                raise Fenced(epoch, int(res[1]))
            if int(res[0]) == 3:
                assumed = f"the processed mark is no longer {guess[0]} or " if guess else ""
                raise GuessWrong(f"{assumed}a message of the step was processed already")
            if int(res[0]) == 4:
                raise StaleState(step.version, int(res[1]))

        self.write_durably("commit", write, deadline_s, replicas=replicas, wait_ms=replica_wait_ms, refused=refused)

    def record_started(self, epoch: int, node: str, key: str, at: float, *, deadline_s: float | None = None,
                       replicas: int = 0, replica_wait_ms: int = 1000) -> None:
        """Write one state entry of ``node`` now, fenced by ``epoch`` (scripts.STARTED): a
        history's "processing" entry or an action's attempt marker (``key`` -> the time ``at``),
        in Redis (on ``replicas`` replicas) before the handler it guards runs. Raises Fenced
        (nothing written) or RedisUnavailable past ``deadline_s``."""
        def write(pipe):
            scripts.queue(pipe, self.scripts["started"], [self.keys.epoch, self.keys.state(node)],
                          [epoch, key, compact(at)])

        def refused(replies):
            if int(replies[0][0]) == -1:
                raise Fenced(epoch, int(replies[0][1]))

        self.write_durably("started", write, deadline_s, replicas=replicas, wait_ms=replica_wait_ms, refused=refused)

    def load_state_version(self, nodes: Iterable[str], deadline_s: float | None = None
                           ) -> tuple[dict[str, dict[str, Any]], str | None, int]:
        """Every node's state entries, the processed mark and the state version, read as one
        (MULTI/EXEC: no step can land between the reads) in one round trip."""
        nodes = list(nodes)

        def read():
            pipe = self.r.pipeline(transaction=True)
            pipe.get(self.keys.version)
            pipe.get(self.keys.processed)
            for node in nodes:
                pipe.hgetall(self.keys.state(node))
            return pipe.execute()

        raw_version, raw_mark, *out = self.call("load state", read, deadline_s)
        mark = raw_mark.decode() if isinstance(raw_mark, bytes) else raw_mark
        # orjson first (json_text.loads): a history's hash is tens of thousands of entries, read on promotion.
        entries = {node: {k.decode(): loads(v) for k, v in raw.items()} for node, raw in zip(nodes, out)}
        return entries, mark, int(raw_version or 0)

    def load_state_logged(self, nodes: Iterable[str], deadline_s: float | None = None
                          ) -> tuple[dict[str, dict[str, Any]], int, LogEntry | None]:
        """The state entries of ``nodes`` (nodes that log their changes), the state version and
        the change log's last entry (None: the log is empty), read as one (MULTI/EXEC)."""
        nodes = list(nodes)

        def read():
            pipe = self.r.pipeline(transaction=True)
            pipe.get(self.keys.version)
            pipe.xrevrange(self.keys.changes, count=1)
            for node in nodes:
                pipe.hgetall(self.keys.state(node))
            return pipe.execute()

        raw_version, last, *out = self.call("load logged state", read, deadline_s)
        entries = {node: {k.decode(): loads(v) for k, v in raw.items()} for node, raw in zip(nodes, out)}
        return entries, int(raw_version or 0), parse_entry(*last[0]) if last else None

    def changes_since(self, after: LogEntry | None, count: int, nodes: Iterable[str] = (),
                      deadline_s: float | None = None) -> ChangesRead:
        """The change log after ``after`` (the entry a reader applied last; None: from the
        start), at most ``count`` entries, with ``after`` itself as the log holds it now, the
        state version and processed mark, and the state of ``nodes`` whole: read as one."""
        nodes = list(nodes)

        def read():
            pipe = self.r.pipeline(transaction=True)
            pipe.get(self.keys.version)
            pipe.get(self.keys.processed)
            if after is not None:
                pipe.xrange(self.keys.changes, min=after.id, max=after.id)
            pipe.xrange(self.keys.changes, min="-" if after is None else "(" + after.id, count=count)
            for node in nodes:
                pipe.hgetall(self.keys.state(node))
            return pipe.execute()

        out = self.call("read the change log", read, deadline_s)
        raw_version, raw_mark = out[0], out[1]
        anchor_raw = out[2] if after is not None else None
        tail_raw = out[3] if after is not None else out[2]
        hashes = out[4:] if after is not None else out[3:]
        return ChangesRead(
            version=int(raw_version or 0),
            mark=raw_mark.decode() if isinstance(raw_mark, bytes) else raw_mark,
            anchor=parse_entry(*anchor_raw[0]) if anchor_raw else None,
            tail=[parse_entry(i, f) for i, f in tail_raw],
            entries={node: {k.decode(): loads(v) for k, v in raw.items()} for node, raw in zip(nodes, hashes)})

    def processed_mark(self, deadline_s: float | None = None) -> str | None:
        """The position up to which every uplink entry was processed, or None before the first delivery."""
        raw = self.call("processed mark", lambda: self.r.get(self.keys.processed), deadline_s)
        return raw.decode() if isinstance(raw, bytes) else raw

    # -- worker: the ID cache ---------------------------------------------
    def processed(self, messages: list[Message], handled_upto: str | None = None,
                  deadline_s: float | None = None, *, replicas: int = 0, replica_wait_ms: int = 1000) -> list[bool]:
        """Per message, whether the flow already processed it: its ID is in the
        ID cache or its position is at or before the processed mark (one round trip).

        ``handled_upto``, when given, is recorded as how far this peer has
        handled the uplink in the same round trip (see :meth:`handled_position`),
        before the answer is read: a master that reads the record after a COMMIT and
        finds it short of a message knows this peer will find the message processed
        (what lets it leave that claim out, ``escalation.read_by``);
        with ``replicas`` > 0 the call returns only once that many replicas have
        the record (as :meth:`record_handled`), in the same round trip too: a
        worker's checkpoint moves past the batch next, and a failover that erased
        the record would leave a restarted worker whose catch-up, once promoted,
        stops before the batch (pair seed 528, tests/sim).
        """
        def write(pipe):
            if handled_upto:  # first: see above
                scripts.queue(pipe, self.scripts["record_handled"], [self.keys.read(self.peer_id)], [handled_upto])
            pipe.get(self.keys.processed)
            if messages:
                pipe.mget([self.keys.id_prefix + m.id for m in messages])

        out = self.write_durably("processed", write, deadline_s, replicas=replicas if handled_upto else 0,
                          wait_ms=replica_wait_ms)
        if not messages:
            return []
        raw_mark, cached = out[1:3] if handled_upto else out[0:2]
        mark = raw_mark.decode() if raw_mark else None
        after = position_order(mark) if mark else None
        return [v is not None or (after is not None and position_order(m.position) <= after)
                for m, v in zip(messages, cached)]

    def record_handled(self, position: str, deadline_s: float | None = None, *, replicas: int = 0,
                       replica_wait_ms: int = 1000) -> None:
        """Record that this peer has handled the uplink up to ``position`` (see :meth:`processed`).

        With ``replicas`` > 0 it returns only once that many replicas have it (``durable.py``),
        else raises RedisUnavailable at ``deadline_s``: a master's batch runs ahead of its
        checkpoint only once this is recorded, and a Redis failover that erased it would leave
        a restarted peer whose checkpoint is past the batch and whose catch-up stops before it
        (pair seed 30, tests/sim). The ``WAIT`` rides in the record's own round trip: what it
        adds per batch run ahead is the replica's acknowledgement, not a second round trip.
        """
        def write(pipe):
            scripts.queue(pipe, self.scripts["record_handled"], [self.keys.read(self.peer_id)], [position])

        self.write_durably("record handled", write, deadline_s, replicas=replicas, wait_ms=replica_wait_ms)

    def handled_position(self, peer_id: str | None = None) -> str | None:
        """How far ``peer_id`` (default: this peer) has handled the uplink in any role, or None."""
        return self._read_field(peer_id, "handled_id")

    def handled_positions(self, peer_ids: list[str], deadline_s: float | None = None) -> dict[str, str | None]:
        """:meth:`handled_position` of each of ``peer_ids``, in one round trip."""
        def read():
            pipe = self.r.pipeline(transaction=False)
            for peer_id in peer_ids:
                pipe.hget(self.keys.read(peer_id), "handled_id")
            return pipe.execute()

        raw = self.call("handled positions", read, deadline_s)
        return {p: v.decode() if isinstance(v, bytes) else v for p, v in zip(peer_ids, raw)}

    def read_position(self, peer_id: str | None = None) -> str | None:
        """The last uplink entry ``peer_id``'s reader recorded as read and processed, or None."""
        return self._read_field(peer_id, "read_id")

    def _read_field(self, peer_id: str | None, name: str) -> str | None:
        raw = self.call(name, lambda: self.r.hget(self.keys.read(peer_id or self.peer_id), name))
        return raw.decode() if isinstance(raw, bytes) else raw

    # -- outlinks ---------------------------------------------------------
    def record_failures(self, failures: list[tuple[str, str, bytes | None, int | None]], *,
                        max_entries: int = 100_000, max_body: int = 1 << 20,
                        deadline_s: float | None = None, replicas: int = 0, replica_wait_ms: int = 1000) -> int:
        """Put (position, reason, body, size) on the failure stream, once per position, unless
        the position is at or before the processed mark (scripts.RECORD_FAILURE), each with a
        FAILED entry in the flow's audit (``audit.py``).

        The stream keeps about ``max_entries`` records and each keeps at most
        ``max_body`` bytes of its body (``size`` is the whole body's length);
        the entry itself stays in the uplink at its position. With ``replicas``
        > 0 it returns only once that many replicas have the records: the step that moves the mark past the entries comes next, and a
        Redis failover in between must not keep the step and lose the records.
        """
        if not failures:
            return 0
        keys = [self.keys.failure, self.keys.processed, self.keys.audit]
        args: list = [self.id_ttl, self.peer_id, max_entries, self.keys.flow, self.epoch_seen]
        for pos, reason, body, size in failures:
            body = body or b""
            keys.append(self.keys.failed_prefix + pos)
            args += [pos, reason, body[:max_body], -1 if size is None else size]
        # Alone, not in a pipeline: the failover simulator's Redis model (chaos/sim/redis_model.py)
        # sees a failure record only in a call of its own.
        (n,) = self.write_durably("record_failure", lambda r: self.scripts["record_failure"](keys=keys, args=args, client=r),
                           deadline_s, replicas=replicas, wait_ms=replica_wait_ms, alone=True)
        return int(n)

    def surface_unclaimed(self, notes: list[tuple[Message, str]], outlink: str, cap: int = 100_000) -> None:
        """Write the claim pair's notices on unclaimed messages (capped stream): ``surfaced``
        when a message baked fully without a claim (it stays held), then, once it leaves,
        ``claimed`` (the master processed it) or ``rolled_back`` (a promoted peer processes
        it). A message's one delivery is the flow's, never the notice."""
        if not notes:
            return

        def write():
            pipe = self.r.pipeline(transaction=False)
            for m, event in notes:
                pipe.xadd(self.keys.unclaimed, {"id": m.id, "position": m.position, "outlink": outlink,
                                                "event": event, "rule": m.rule or "", "node": self.peer_id},
                          maxlen=cap, approximate=True)
            pipe.execute()

        self.call("surface_unclaimed", write)

    # -- restores (twinflow restore, cluster/flow_restore.py) ---------------
    def restore_marks(self, deadline_s: float | None = None) -> tuple[dict | None, dict | None]:
        """The mark of a restore under way or unfinished (``tf:{F}:restoring``, JSON) and the
        record of the last finished one (``tf:{F}:restored``), each None when absent; one round trip."""
        def read():
            pipe = self.r.pipeline(transaction=False)
            pipe.get(self.keys.restoring)
            pipe.hgetall(self.keys.restored)
            return pipe.execute()

        raw_mark, raw_done = self.call("read the restore marks", read, deadline_s)
        mark = loads(raw_mark) if raw_mark else None
        done = {k.decode(): v.decode() for k, v in raw_done.items()} if raw_done else None
        return mark, done

    # -- peer status ------------------------------------------------------
    def write_status(self, status: dict, ttl_s: int = 10) -> None:
        """One attempt, no retry (the next status replaces it): raises when Redis does not answer.
        A mapping (``rule_pending``, ``suspended``, ``pending_nodes``) is written as JSON text, read
        back as a mapping."""
        key = self.keys.peer(self.peer_id)

        def write():
            pipe = self.r.pipeline(transaction=False)
            pipe.sadd(self.keys.peers, self.peer_id)
            pipe.hset(key, mapping={k: json.dumps(v) if isinstance(v, dict) else str(v) for k, v in status.items()})
            pipe.expire(key, ttl_s)
            pipe.execute()

        self.call("write_status", write, deadline_s=0)

    def drop_status(self) -> None:
        """One attempt to remove this peer's status (a peer stopping): `twinflow status` stops
        showing it at once, and a wait for it to stream again sees only its next process's.
        Raises when Redis does not answer (the status then lapses by its TTL)."""
        self.call("drop_status", lambda: self.r.delete(self.keys.peer(self.peer_id)), deadline_s=0)

    def read_statuses(self, deadline_s: float | None = None) -> list[dict]:
        """The live status of every peer of the flow (stale peers drop out by TTL). A mapping that is
        not the JSON text ``write_status`` writes stays text, and its name is in the row's
        ``malformed``: one bad value does not hide every peer."""

        def read():
            out = []
            for raw in sorted(self.r.smembers(self.keys.peers)):
                nid = raw.decode() if isinstance(raw, bytes) else raw
                h = self.r.hgetall(self.keys.peer(nid))
                if not h:
                    continue
                row = {k.decode(): v.decode() for k, v in h.items()}
                row.setdefault("peer_id", row.get("node_id", nid))  # a peer that writes only node_id (mid-upgrade)
                for mapping in ("rule_pending", "suspended", "pending_nodes", "links"):  # written as JSON text (write_status)
                    if row.get(mapping, "").startswith("{"):
                        try:
                            row[mapping] = loads(row[mapping])
                        except ValueError:  # not what write_status wrote: kept as text, and named
                            row.setdefault("malformed", []).append(mapping)
                out.append(row)
            return out

        return self.call("read_statuses", read, deadline_s)
