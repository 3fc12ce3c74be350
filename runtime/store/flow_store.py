"""A flow's shared state in Redis: uplink, sink, ID cache, processed mark, failures, epochs, node status.

Every key of flow ``F`` starts with ``tf:{F}:`` (one hash slot per flow).

Under failure: when Redis is down, times out, is out of memory or read-only
(a replica after a failover), a call waits and retries with a bounded
back-off (logging what it waits for) until Redis answers, the store is
closed (:class:`StoreClosed`) or the call's deadline passes
(:class:`RedisUnavailable`); it never drops a write silently. Every call
has a deadline: the caller's, else the store's ``call_deadline_s`` (300 s by
default, as the Spark reader's), so no thread waits for Redis for ever.
Where the flow's primary is can change: on a Redis Cluster a crashed
primary gives only connection errors until its replica takes over, so on a
connection error the store asks every cluster node it knows who owns the
flow's slot now and moves there (``redis_slot.relocate``); with Sentinel
the client asks the Sentinels for the primary as it reconnects. The first
call that fails logs the outage once (``redis_down``), the first answer
after it its end and length (``redis_back``), whichever thread sees them. Retrying a
write is safe even when Redis applied it and only the reply was lost: a
master step carries a marker unique to it and is applied once (the
simulator found the double feed before it did), failure records are keyed
by uplink position, epochs and status are set, not added. A re-sent
``publish`` may append a body twice; the ID cache skips the second. A
delivery from a writer whose epoch is older than the newest raises
:class:`Fenced` and changes nothing. The master's writes carry a deadline
(its write lease, shorter than its ZooKeeper session) so that a master cut
off from Redis gives up the role instead of holding it while it waits.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...logs import event
from ..message import Message
from ..positions import position_order
from ..waiting import retry
from .flow_keys import FlowKeys
from .redis_slot import follow_moved, relocate
from . import scripts

if TYPE_CHECKING:
    from .step import Step

log = logging.getLogger("twinflow.store")
T = TypeVar("T")

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# Errors a Redis answers with while it cannot take writes for now: out of
# memory (noeviction at maxmemory), a read-only replica after a failover, a
# master without its replicas. Waiting may cure them; nothing was written.
TRANSIENT_REPLIES = ("OOM", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "LOADING")

# redis-py strips the code off the replies it has a class for.
# MOVED: the flow's slot has a new owner on a Redis Cluster; the store reconnects there first.
TRANSIENT_ERRORS = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                    redis.exceptions.MasterDownError, redis.exceptions.TryAgainError,
                    redis.exceptions.ClusterDownError, redis.exceptions.MovedError)

DEFAULT_CALL_DEADLINE_S = 300.0  # a call's deadline when its caller gives none (see module)

DELIVER_MAX_MESSAGES = 1000      # per delivery script: keeps each script short
DELIVER_MAX_BYTES = 16 << 20     # per delivery script: far below Redis's 1 GiB query buffer


class Fenced(RuntimeError):
    """A write carried an epoch older than the newest one; nothing was written."""

    def __init__(self, epoch: int, newest: int):
        super().__init__(f"epoch {epoch} is stale (newest is {newest}): write refused")
        self.epoch, self.newest = epoch, newest


class GuessWrong(RuntimeError):
    """A guarded commit found the processed mark moved or one of its IDs processed; nothing was written."""


class StaleState(GuessWrong):
    """A step was computed from a state version that is no longer the one in Redis (another
    writer committed since its flow was loaded); nothing was written: load the state again."""

    def __init__(self, version: int, in_force: int):
        super().__init__(f"the step was computed from state version {version}, Redis holds {in_force}")
        self.version, self.in_force = version, in_force


class StoreClosed(RuntimeError):
    """The store was closed while a call waited for Redis."""


class RedisUnavailable(RuntimeError):
    """Redis did not answer (or refused writes) for longer than the call's deadline; nothing was lost."""

    def __init__(self, what: str, waited_s: float, last: BaseException):
        super().__init__(f"Redis did not answer {what} for {waited_s:.1f} s: {last}")
        self.what, self.waited_s, self.last = what, waited_s, last


def transient(exc: BaseException) -> bool:
    """True for an error that waiting may cure (connection trouble, OOM, read-only, loading)."""
    if isinstance(exc, RETRYABLE + TRANSIENT_ERRORS):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(TRANSIENT_REPLIES)


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


class FlowStore:
    """Typed, retrying access to one flow's Redis state."""

    def __init__(
        self,
        client: redis.Redis,
        keys: FlowKeys,
        node_id: str,
        *,
        id_ttl: int = 7 * 86400,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        call_deadline_s: float = DEFAULT_CALL_DEADLINE_S,
    ):
        self.keys = keys
        self.call_deadline_s = call_deadline_s
        self._relocating = threading.Lock()  # one thread at a time looks for the flow's primary
        self.node_id = node_id
        self.id_ttl = id_ttl
        self._sleep = sleep
        self._monotonic = monotonic
        self._closed = threading.Event()
        self._use(client)
        self.last_ok = monotonic()  # when a call last got an answer from Redis
        self.failing_since: float | None = None  # when calls began to fail, while they fail
        self.outages = 0  # times calls began to fail (redis_down), for the metrics
        self._outage = threading.Lock()  # several threads call at once: one redis_down/redis_back line each
        self.epoch_seen = 0  # the newest fencing epoch this store read or set (for the log)

    def _use(self, client: redis.Redis) -> None:
        # This store owns waiting and deadlines: redis-py's own retries (ten by
        # default in redis-py 8, with back-off) would stretch every deadline.
        client.set_retry(Retry(NoBackoff(), 0))
        self.r = client
        self._scripts = scripts.register(client)

    def close(self) -> None:
        self._closed.set()

    # -- retry ------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """``fn()``, retried while Redis is unreachable or refuses writes for now.

        ``deadline_s`` None waits up to the store's ``call_deadline_s`` (or until
        closed); 0 tries once; otherwise RedisUnavailable once that many seconds
        have passed. A connection error makes the store look for the flow's
        primary again (see module) and, when it moved, try there at once.
        """
        if deadline_s is None:
            deadline_s = self.call_deadline_s

        def attempt() -> T:
            client = self.r
            try:
                try:
                    result = fn()
                except (redis.ConnectionError, redis.TimeoutError):
                    if not self._relocate(client):
                        raise
                    result = fn()  # the flow's primary is elsewhere now: once more, there
            except redis.exceptions.MovedError as moved:
                # The flow's slot has a new owner (a cluster failover or a reshard): go there.
                log.warning("Redis Cluster moved the flow's slot to %s:%s; reconnecting", moved.host, moved.port)
                self._use(follow_moved(self.r, moved))
                raise
            except redis.RedisError as exc:
                if transient(exc) and self.failing_since is None:
                    self._went_down(what, exc)
                raise
            self.last_ok = self._monotonic()
            if self.failing_since is not None:
                self._came_back()
            return result

        def before_pause(exc: BaseException, waited: float, pause: float) -> None:
            if self._closed.is_set():
                raise StoreClosed(what) from exc
            log.warning("Redis unavailable during %s (%s); retrying in %.2f s", what, exc, pause)

        return retry(attempt, retryable=lambda exc: isinstance(exc, redis.RedisError) and transient(exc),
                     deadline_s=deadline_s, give_up=lambda exc, waited: RedisUnavailable(what, waited, exc),
                     on_retry=before_pause, sleep=self._sleep, monotonic=self._monotonic)

    def _relocate(self, failed: redis.Redis) -> bool:
        """After ``failed`` gave a connection error: True when the store now uses a client on
        another node (the primary that serves the flow now), else False."""
        with self._relocating:
            if self.r is not failed:  # another thread moved the store already
                return True
            try:
                moved = relocate(failed)
            except redis.RedisError:
                return False
            if moved is failed:
                return False
            self._use(moved)
            return True

    def _went_down(self, what: str, exc: BaseException) -> None:
        with self._outage:
            if self.failing_since is not None:
                return
            self.failing_since = self._monotonic()
            self.outages += 1
        event(log, logging.WARNING, "redis_down", "Redis stopped answering (%s during %s)", exc, what,
              flow=self.keys.flow, node=self.node_id, epoch=self.epoch_seen or None, during=what, error=str(exc))

    def _came_back(self) -> None:
        with self._outage:
            since, self.failing_since = self.failing_since, None
        if since is not None:
            down = self._monotonic() - since
            event(log, logging.INFO, "redis_back", "Redis answers again after %.1f s", down,
                  flow=self.keys.flow, node=self.node_id, epoch=self.epoch_seen or None, seconds=round(down, 3))

    def health(self) -> str:
        """"ok", or "down <s>s" while calls to Redis fail (what ``twinflow status`` shows)."""
        since = self.failing_since
        return "ok" if since is None else f"down {self._monotonic() - since:.0f}s"

    def silent_s(self) -> float:
        """Seconds since a call last got an answer from Redis (on the store's clock)."""
        return self._monotonic() - self.last_ok

    def ping(self) -> bool:
        """One PING, no retry: whether Redis answers now."""
        try:
            self._call("ping", lambda: self.r.ping(), deadline_s=0)
            return True
        except (RedisUnavailable, redis.RedisError):
            return False

    # -- start-up checks --------------------------------------------------
    def config_problems(self) -> list[str]:
        """What in this Redis's configuration can break the promises (empty: none found).

        The ID cache and the processed mark must never be evicted, and the
        epoch and the mark must survive a restart. A Redis that refuses
        CONFIG (a managed service) is reported as unverifiable.
        """
        try:
            conf = self._call("CONFIG GET", lambda: {
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

        With ``replicas`` > 0 (``cluster.wait_replicas``) it returns only once ``WAIT``
        confirms that many replicas have the epoch, as a COMMIT does, else raises
        RedisUnavailable at ``deadline_s``: a Redis failover right after a promotion
        cannot bring back the old epoch, under which the old master's COMMITs would pass.
        """
        began = self._monotonic()

        def write():
            if not replicas:
                return self._scripts["raise_epoch"](keys=[self.keys.epoch], args=[epoch]), replicas
            # WAIT counts the writes of its own connection: same pipeline.
            pipe = self.r.pipeline(transaction=False)
            self._scripts["raise_epoch"](keys=[self.keys.epoch], args=[epoch], client=pipe)
            pipe.execute_command("WAIT", replicas, replica_wait_ms)
            raised, acked = pipe.execute()
            return raised, int(acked)

        raised, acked = self._call("raise_epoch", write, deadline_s)
        in_force = int(raised)
        if acked < replicas:
            left = None if deadline_s is None else max(0.0, deadline_s - (self._monotonic() - began))
            self._await_replicas(replicas, replica_wait_ms, left)
        self.epoch_seen = max(self.epoch_seen, in_force)
        return in_force

    def current_epoch(self, deadline_s: float | None = None) -> int:
        epoch = int(self._call("current_epoch", lambda: self.r.get(self.keys.epoch), deadline_s) or 0)
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
        already (both: nothing written). With ``replicas`` > 0 it returns only once ``WAIT``
        confirms that many replicas have it, so a Redis failover cannot erase
        what the caller escalates next. With ``guess`` (the processed mark the
        caller assumes, in a 1-tuple) it raises GuessWrong, nothing written,
        unless the mark is that and none of the step's IDs is processed.
        """
        if step.empty():
            return
        # One token per step: a retry after a lost reply finds the step applied (scripts.COMMIT).
        keys, args = step.script_call(epoch, self.keys, self.id_ttl, f"{self.node_id}-{uuid.uuid4().hex}",
                                      guess)

        def write():
            if not replicas:
                return self._scripts["commit"](keys=keys, args=args), replicas
            # WAIT counts the writes of its own connection: same pipeline.
            pipe = self.r.pipeline(transaction=False)
            self._scripts["commit"](keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", replicas, replica_wait_ms)
            res, acked = pipe.execute()
            return res, int(acked)

        res, acked = self._call("commit", write, deadline_s)
        if int(res[0]) == -1:
            raise Fenced(epoch, int(res[1]))
        if int(res[0]) == 3:
            assumed = f"the processed mark is no longer {guess[0]} or " if guess else ""
            raise GuessWrong(f"{assumed}a message of the step was processed already")
        if int(res[0]) == 4:
            raise StaleState(step.version, int(res[1]))
        if acked < replicas:
            self._await_replicas(replicas, replica_wait_ms, deadline_s)

    def load_state(self, nodes: Iterable[str], deadline_s: float | None = None) -> dict[str, dict[str, Any]]:
        """Every node's state entries (node -> key -> JSON value), in one round trip."""
        return self.load_state_version(nodes, deadline_s)[0]

    def load_state_and_mark(self, nodes: Iterable[str], deadline_s: float | None = None
                            ) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Every node's state entries and the processed mark, read together in one round trip."""
        entries, mark, _ = self.load_state_version(nodes, deadline_s)
        return entries, mark

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

        raw_version, raw_mark, *out = self._call("load state", read, deadline_s)
        mark = raw_mark.decode() if isinstance(raw_mark, bytes) else raw_mark
        entries = {node: {k.decode(): json.loads(v) for k, v in raw.items()} for node, raw in zip(nodes, out)}
        return entries, mark, int(raw_version or 0)

    def _await_replicas(self, replicas: int, wait_ms: int, deadline_s: float | None) -> None:
        """Wait until ``replicas`` replicas have everything written so far, or RedisUnavailable."""
        began = self._monotonic()
        sync_key = self.keys.prefix + "sync:" + self.node_id

        def confirm():
            # A write on this connection moves its offset past the delivery
            # (replication is ordered), so WAIT covers the delivery too.
            pipe = self.r.pipeline(transaction=False)
            pipe.incr(sync_key)
            pipe.execute_command("WAIT", replicas, wait_ms)
            acked = int(pipe.execute()[1])
            if acked < replicas:
                raise redis.ResponseError(f"NOREPLICAS {acked} of {replicas} replicas confirmed within {wait_ms} ms")

        left = None if deadline_s is None else max(0.0, deadline_s - (self._monotonic() - began))
        self._call("wait for replicas", confirm, left)

    def processed_mark(self, deadline_s: float | None = None) -> str | None:
        """The position up to which every uplink entry was processed, or None before the first delivery."""
        raw = self._call("processed mark", lambda: self.r.get(self.keys.processed), deadline_s)
        return raw.decode() if isinstance(raw, bytes) else raw

    # -- worker: the ID cache ---------------------------------------------
    def processed(self, messages: list[Message], handled_upto: str | None = None,
                  deadline_s: float | None = None) -> list[bool]:
        """Per message, whether the flow already processed it: its ID is in the
        ID cache or its position is at or before the processed mark (one round trip).

        ``handled_upto``, when given, is recorded as how far this node has
        handled the uplink in the same round trip (see :meth:`handled_position`).
        """
        def read():
            pipe = self.r.pipeline(transaction=False)
            pipe.get(self.keys.processed)
            if messages:
                pipe.mget([self.keys.id_prefix + m.id for m in messages])
            if handled_upto:
                self._scripts["record_handled"](keys=[self.keys.read(self.node_id)], args=[handled_upto], client=pipe)
            return pipe.execute()

        out = self._call("processed", read, deadline_s)
        if not messages:
            return []
        mark = out[0].decode() if out[0] else None
        after = position_order(mark) if mark else None
        return [v is not None or (after is not None and position_order(m.position) <= after)
                for m, v in zip(messages, out[1])]

    def record_handled(self, position: str, deadline_s: float | None = None) -> None:
        """Record that this node has handled the uplink up to ``position`` (see :meth:`processed`)."""
        self._call("record handled", lambda: self._scripts["record_handled"](
            keys=[self.keys.read(self.node_id)], args=[position]), deadline_s)

    def handled_position(self, node_id: str | None = None) -> str | None:
        """How far ``node_id`` (default: this node) has handled the uplink in any role, or None."""
        return self._read_field(node_id, "handled_id")

    def read_position(self, node_id: str | None = None) -> str | None:
        """The last uplink entry ``node_id``'s reader recorded as read and processed, or None."""
        return self._read_field(node_id, "read_id")

    def _read_field(self, node_id: str | None, name: str) -> str | None:
        raw = self._call(name, lambda: self.r.hget(self.keys.read(node_id or self.node_id), name))
        return raw.decode() if isinstance(raw, bytes) else raw

    # -- outlinks ---------------------------------------------------------
    def record_failures(self, failures: list[tuple[str, str, bytes | None, int | None]], *,
                        max_entries: int = 100_000, max_body: int = 1 << 20,
                        deadline_s: float | None = None, replicas: int = 0, replica_wait_ms: int = 1000) -> int:
        """Put (position, reason, body, size) on the failure stream, once per position, unless
        the position is at or before the processed mark (scripts.RECORD_FAILURE).

        The stream keeps about ``max_entries`` records and each keeps at most
        ``max_body`` bytes of its body (``size`` is the whole body's length);
        the entry itself stays in the uplink at its position. With ``replicas``
        > 0 it returns only once ``WAIT`` confirms that many replicas have the
        records: the step that moves the mark past the entries comes next, and a
        Redis failover in between must not keep the step and lose the records.
        """
        if not failures:
            return 0
        keys = [self.keys.failure, self.keys.processed]
        args: list = [self.id_ttl, self.node_id, max_entries]
        for pos, reason, body, size in failures:
            body = body or b""
            keys.append(self.keys.failed_prefix + pos)
            args += [pos, reason, body[:max_body], -1 if size is None else size]
        n = int(self._call("record_failure", lambda: self._scripts["record_failure"](
            keys=keys, args=args), deadline_s))
        if replicas:
            self._await_replicas(replicas, replica_wait_ms, deadline_s)
        return n

    def surface_unclaimed(self, messages: list[Message], outlink: str, cap: int = 100_000) -> None:
        """Make fully baked, unclaimed messages visible (capped stream; they stay in the node)."""
        if not messages:
            return

        def write():
            pipe = self.r.pipeline(transaction=False)
            for m in messages:
                pipe.xadd(self.keys.unclaimed, {"id": m.id, "position": m.position, "outlink": outlink,
                                                "node": self.node_id}, maxlen=cap, approximate=True)
            pipe.execute()

        self._call("surface_unclaimed", write)

    # -- uplink -----------------------------------------------------------
    def publish(self, bodies: Iterable[bytes], deadline_s: float | None = None, *, replicas: int = 0,
                replica_wait_ms: int = 1000) -> list[str]:
        """Append documents to the uplink; returns their entry IDs.

        RedisUnavailable once ``deadline_s`` passes without Redis answering. With
        ``replicas`` > 0 (``cluster.wait_replicas``, for the gRPC ingest) it returns only
        once ``WAIT`` confirms that many replicas have the entries, so that a Redis
        failover cannot erase an entry the producer was told is written.
        """
        bodies = list(bodies)
        began = self._monotonic()

        def write():
            pipe = self.r.pipeline(transaction=False)
            for b in bodies:
                pipe.xadd(self.keys.uplink, {"data": b})
            if replicas:
                pipe.execute_command("WAIT", replicas, replica_wait_ms)
            out = pipe.execute()
            acked = int(out.pop()) if replicas else 0
            return [p.decode() if isinstance(p, bytes) else p for p in out], acked

        positions, acked = self._call("publish", write, deadline_s)
        if acked < replicas:
            left = None if deadline_s is None else max(0.0, deadline_s - (self._monotonic() - began))
            self._await_replicas(replicas, replica_wait_ms, left)
        return positions

    def read_uplink(self, after: str | None, upto: str, count: int, max_body: int, *,
                    max_bytes: int = 64 << 20, deadline_s: float | None = None
                    ) -> list[tuple[str, bytes | None, int | None]]:
        """Uplink entries after ``after`` (exclusive; None: from the start) up to ``upto``,
        as (position, data, size) rows bounded like a Spark batch: at most ``count``
        entries and ``max_bytes`` of bodies, a body over ``max_body`` withheld (data None)."""
        args = scripts.read_batch_args(after or "0-0", upto, count, max_bytes, max_body)
        reply = self._call("read uplink", lambda: self._scripts["read_batch"](keys=[self.keys.uplink], args=args),
                           deadline_s)
        return scripts.read_batch_rows(reply)

    def entries_upto(self, position: str) -> int:
        """How many entries the uplink has had up to ``position``: all it was ever given
        minus those after it (counted by reading their IDs, so meant for a short tail)."""
        def count():
            try:
                added = int(self.r.xinfo_stream(self.keys.uplink).get("entries-added", 0))
            except redis.ResponseError:  # no stream yet
                return 0
            after, n = position, 0
            while True:
                page = self.r.xrange(self.keys.uplink, "(" + after, "+", count=10_000)
                n += len(page)
                if len(page) < 10_000:
                    return max(0, added - n)
                after = page[-1][0].decode()

        return self._call("count uplink entries", count)

    def trim_uplink(self, live_nodes: Iterable[str], retention_s: float, now_s: float,
                    deadline_s: float | None = 0) -> tuple[int, str | None]:
        """Trim the uplink entries that no one needs: before the processed mark, before the
        read position of every node in ``live_nodes``, and older than ``retention_s`` at
        ``now_s`` (the margin kept for replay). Returns (entries trimmed, first entry kept)."""
        cutoff = f"{max(0, int((now_s - retention_s) * 1000))}-0"
        keys = [self.keys.uplink, self.keys.processed, self.keys.trimmed,
                *(self.keys.read(n) for n in sorted(live_nodes))]
        n, kept = self._call("trim uplink", lambda: self._scripts["trim_uplink"](keys=keys, args=[cutoff]),
                             deadline_s)
        return int(n), kept.decode() if isinstance(kept, bytes) else (kept or None)

    def trimmed_before(self) -> str | None:
        """The first uplink entry the last trim kept (entries before it are gone), or None."""
        raw = self._call("trim record", lambda: self.r.get(self.keys.trimmed))
        return raw.decode() if isinstance(raw, bytes) else raw

    def oldest_after(self, after: str | None) -> str | None:
        """The position of the first uplink entry after ``after`` (None: the first of all), or None."""
        low = "-" if after is None else "(" + after
        entries = self._call("read uplink", lambda: self.r.xrange(self.keys.uplink, low, "+", count=1))
        return entries[0][0].decode() if entries else None

    def uplink_lag(self, node_id: str) -> int:
        """Uplink entries ``node_id`` has not read yet (entries-added minus what it read).

        One attempt, no retry: status must answer (or fail) at once when Redis is down.
        """
        try:
            added = int(self.r.xinfo_stream(self.keys.uplink).get("entries-added", 0))
        except redis.ResponseError:  # no stream yet
            added = 0
        got = self.r.hget(self.keys.read(node_id), "read_n")
        return max(0, added - int(got or 0))

    # -- node status ------------------------------------------------------
    def write_status(self, status: dict, ttl_s: int = 10) -> None:
        """One attempt, no retry (the next status replaces it): raises when Redis does not answer."""
        key = self.keys.node(self.node_id)

        def write():
            pipe = self.r.pipeline(transaction=False)
            pipe.sadd(self.keys.nodes, self.node_id)
            pipe.hset(key, mapping={k: str(v) for k, v in status.items()})
            pipe.expire(key, ttl_s)
            pipe.execute()

        self._call("write_status", write, deadline_s=0)

    def read_statuses(self, deadline_s: float | None = None) -> list[dict]:
        """The live status of every node of the flow (stale nodes drop out by TTL)."""

        def read():
            out = []
            for raw in sorted(self.r.smembers(self.keys.nodes)):
                nid = raw.decode() if isinstance(raw, bytes) else raw
                h = self.r.hgetall(self.keys.node(nid))
                if not h:
                    continue
                out.append({k.decode(): v.decode() for k, v in h.items()})
            return out

        return self._call("read_statuses", read, deadline_s)
