"""A flow's shared state in Redis: uplink, sink, ID cache, failures, epochs, node status.

Every key of flow ``F`` starts with ``tf:{F}:`` (one hash slot per flow).

Under failure: when Redis is down or times out, every call waits and
retries with a bounded back-off (logging what it waits for) until Redis
answers or the store is closed; it never drops a write. Retrying a write is
safe because every write is idempotent: delivery is keyed by message ID in
the ID cache, failure records by uplink position. A delivery from a writer
whose epoch is older than the newest raises :class:`Fenced` and changes
nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

import redis

from ..message import Message
from . import scripts

log = logging.getLogger("twinflow.store")
T = TypeVar("T")

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


class Fenced(RuntimeError):
    """A write carried an epoch older than the newest one; nothing was written."""

    def __init__(self, epoch: int, newest: int):
        super().__init__(f"epoch {epoch} is stale (newest is {newest}): write refused")
        self.epoch, self.newest = epoch, newest


class StoreClosed(RuntimeError):
    """The store was closed while a call waited for Redis."""


@dataclass(frozen=True)
class FlowKeys:
    flow: str
    uplink_stream: str = "uplink"
    sink_stream: str = "sink"

    @property
    def prefix(self) -> str:
        return f"tf:{{{self.flow}}}:"

    @property
    def uplink(self) -> str:
        return self.prefix + self.uplink_stream

    @property
    def sink(self) -> str:
        return self.prefix + self.sink_stream

    @property
    def failure(self) -> str:
        return self.prefix + "failure"

    @property
    def unclaimed(self) -> str:
        return self.prefix + "unclaimed"

    @property
    def epoch(self) -> str:
        return self.prefix + "epoch"

    @property
    def id_prefix(self) -> str:
        return self.prefix + "id:"

    @property
    def failed_prefix(self) -> str:
        return self.prefix + "failed:"

    @property
    def nodes(self) -> str:
        return self.prefix + "nodes"

    def node(self, node_id: str) -> str:
        return self.prefix + "node:" + node_id

    def read(self, node_id: str) -> str:
        """Where a node's uplink reader records how far it has read (read_n, read_id)."""
        return self.prefix + "read:" + node_id


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
    ):
        self.r = client
        self.keys = keys
        self.node_id = node_id
        self.id_ttl = id_ttl
        self._sleep = sleep
        self._closed = threading.Event()
        self._scripts = scripts.register(client)

    def close(self) -> None:
        self._closed.set()

    # -- retry ------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        backoff = 0.05
        while True:
            try:
                return fn()
            except RETRYABLE as exc:
                if self._closed.is_set():
                    raise StoreClosed(what) from exc
                log.warning("Redis unavailable during %s (%s); retrying in %.2f s", what, exc, backoff)
                self._sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    # -- epochs -----------------------------------------------------------
    def raise_epoch(self, epoch: int) -> int:
        """Make ``epoch`` the fencing epoch unless a newer one exists; returns the one in force."""
        return int(self._call("raise_epoch", lambda: self._scripts["raise_epoch"](keys=[self.keys.epoch], args=[epoch])))

    def current_epoch(self) -> int:
        return int(self._call("current_epoch", lambda: self.r.get(self.keys.epoch)) or 0)

    # -- master: delivery -------------------------------------------------
    def deliver(self, epoch: int, messages: list[Message]) -> list[bool]:
        """Deliver to the sink and record IDs, atomically and fenced by ``epoch``.

        Returns, per message, True if delivered now, False if its ID was
        already in the ID cache. Raises Fenced if ``epoch`` is stale.
        """
        if not messages:
            return []
        args: list = [epoch, self.id_ttl, self.keys.id_prefix, self.node_id]
        for m in messages:
            args += [m.id, m.position, m.body]
        res = self._call("deliver", lambda: self._scripts["deliver"](keys=[self.keys.epoch, self.keys.sink], args=args))
        if int(res[0]) == -1:
            raise Fenced(epoch, int(res[1]))
        return [bool(int(f)) for f in res[1:]]

    # -- worker: the ID cache ---------------------------------------------
    def processed(self, ids: list[str]) -> list[bool]:
        """Per ID, whether the ID cache holds it (one round trip)."""
        if not ids:
            return []
        keys = [self.keys.id_prefix + i for i in ids]
        vals = self._call("processed", lambda: self.r.mget(keys))
        return [v is not None for v in vals]

    # -- outlinks ---------------------------------------------------------
    def record_failures(self, failures: list[tuple[str, str, bytes | None]]) -> int:
        """Put (position, reason, body) on the failure stream, once per position."""
        if not failures:
            return 0
        args: list = [self.id_ttl, self.keys.failed_prefix, self.node_id]
        for pos, reason, body in failures:
            args += [pos, reason, body if body is not None else b""]
        return int(self._call("record_failure", lambda: self._scripts["record_failure"](keys=[self.keys.failure], args=args)))

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
    def publish(self, bodies: Iterable[bytes]) -> list[str]:
        """Append documents to the uplink; returns their entry IDs."""
        bodies = list(bodies)

        def write():
            pipe = self.r.pipeline(transaction=False)
            for b in bodies:
                pipe.xadd(self.keys.uplink, {"data": b})
            return [p.decode() if isinstance(p, bytes) else p for p in pipe.execute()]

        return self._call("publish", write)

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
        key = self.keys.node(self.node_id)

        def write():
            pipe = self.r.pipeline(transaction=False)
            pipe.sadd(self.keys.nodes, self.node_id)
            pipe.hset(key, mapping={k: str(v) for k, v in status.items()})
            pipe.expire(key, ttl_s)
            pipe.execute()

        self._call("write_status", write)

    def read_statuses(self) -> list[dict]:
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

        return self._call("read_statuses", read)
