"""Publishing to a local cluster: :class:`Producing`, the publishing half of
:class:`~twinflow.testing.local_cluster.LocalCluster` (XADD through the producer's proxy when
proxied, following the primary on a Redis with replicas, to each document's shard on a sharded
flow), and the producers that run beside a cluster: :class:`IngestPublisher` (through a live
peer's gRPC Ingest, the demo), :class:`DrillProducer` (the drills) and :class:`UplinkPublisher`
(pipelined XADDs that remember each message's uplink time, the benches)."""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Callable

import redis

from ..client import publish
from ..runtime.positions import position_order
from .checker import SETTLE_S, SinkReport, check_sink, read_sink
from .messages import order_or_payment

if TYPE_CHECKING:
    from .local_cluster import LocalCluster

# The documents of one pipeline of UplinkPublisher.
_PUBLISH_CHUNK = 5000


class Producing:
    """Mixed into :class:`~twinflow.testing.local_cluster.LocalCluster`: uses its ``producer``
    client, ``keys``, ``ha``, ``wait_replicas`` and ``_on_ha``."""

    def publish(self, docs: list[dict]) -> list[str]:
        """XADD through the producer's proxy, retrying while that link is down; returns positions.

        The pipeline is built again for each attempt: redis-py empties a pipeline when it
        executes, failed or not, so a retried one sent nothing and "published" every
        message of the batch (the redis-restart drill found it: 50 messages counted lost
        that were never sent). A retry after a lost reply may append a batch twice; the
        flow's ID cache takes each message once."""
        if self.ha is not None:
            return self._publish_ha(docs)
        deadline = time.monotonic() + 30
        while True:
            pipe = self.producer.pipeline(transaction=False)
            for doc in docs:
                body = json.dumps(doc)
                pipe.xadd(self.uplink_of(body), {"data": body})
            try:
                positions = [p.decode() for p in pipe.execute()]
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            if len(positions) != len(docs):
                raise RuntimeError(f"published {len(positions)} of {len(docs)} documents")
            return positions

    def _publish_ha(self, docs: list[dict]) -> list[str]:
        """XADD on the primary of the moment; with ``wait_replicas``, acknowledged only once WAIT
        says that many replicas have the batch (else the batch is sent again: the ID cache takes
        each message once)."""
        def send(r):
            pipe = r.pipeline(transaction=False)
            for doc in docs:
                body = json.dumps(doc)
                pipe.xadd(self.uplink_of(body), {"data": body})
            if self.wait_replicas:
                pipe.execute_command("WAIT", self.wait_replicas, 1000)
            out = pipe.execute()
            if self.wait_replicas and int(out.pop()) < self.wait_replicas:
                raise redis.ConnectionError(f"WAIT: fewer than {self.wait_replicas} replicas have the batch")
            return [p.decode() for p in out]

        positions = self._on_ha("producer", send)
        if len(positions) != len(docs):
            raise RuntimeError(f"published {len(positions)} of {len(docs)} documents")
        return positions

    def uplink_of(self, body: str | bytes) -> str:
        """The uplink a body goes to: its shard's on a sharded flow (``uplink.shard_key``)."""
        if self.router.shards == 1:
            return self.keys.uplink
        return self.shard_keys[self.router.shard_of(body.encode() if isinstance(body, str) else body)].uplink

    def publish_raw(self, body: bytes) -> str:
        """XADD one body as it is (bad input too); returns its uplink position."""
        return self.producer.xadd(self.uplink_of(body), {"data": body}).decode()

    def publish_numbered(self, n: int, prefix: str = "m") -> list[str]:
        """Publish ``n`` documents {id, seq} numbered on from the last (IDs ``prefix`` + seq),
        remembered in ``sent``; returns their uplink positions."""
        docs = [{"id": f"{prefix}{seq:06d}", "seq": seq} for seq in range(self._seq, self._seq + n)]
        self._seq += n
        positions = self.publish(docs)
        self.sent.extend(d["id"] for d in docs)
        return positions

    def sink_ids(self) -> list[str]:
        return [e.id for e in read_sink(self.redis, self.sink_key)]

    def wait_delivered(self, timeout_s: float = 90, quiet_s: float = SETTLE_S) -> SinkReport:
        """Until every ID in ``sent`` is in the sink and the sink has then gone quiet (no new entry
        for ``quiet_s``); returns the exactly-once report. Judged only once quiet: a duplicate
        that lands after the last ID is counted, not missed."""
        from ..runtime.waiting import wait_for, wait_settled

        began = time.monotonic()
        if not wait_for(lambda: set(self.sent) <= set(self.sink_ids()), timeout_s, 0.2):
            missing = sorted(set(self.sent) - set(self.sink_ids()))
            raise RuntimeError(f"{len(missing)} of {len(self.sent)} sent messages not in the sink within "
                               f"{timeout_s:.0f} s: {missing[:10]}\n{self.logs(60)}")
        left = max(quiet_s, timeout_s - (time.monotonic() - began))
        if wait_settled(lambda: self.redis.xlen(self.sink_key), quiet_s, left, 0.1) is None:
            raise RuntimeError(f"the sink did not go quiet for {quiet_s} s within {timeout_s:.0f} s of "
                               f"the first sends\n{self.logs(60)}")
        return check_sink(read_sink(self.redis, self.sink_key), self.sent)


class PacedProducer(threading.Thread):
    """Publishes ``count`` documents ``document(seq)`` in batches through ``send(docs)`` at ``rate``
    per second; while ``gate`` (if any) is clear it waits, and paces again from when it opens.
    ``ids`` holds what was sent (each document's ID as ``id_of`` reads it; default its ``id``),
    ``error`` what stopped it (for the caller to report)."""

    def __init__(self, name: str, send: Callable[[list[dict]], object], document: Callable[[int], dict],
                 count: int, rate: float, batch: int = 50, gate: threading.Event | None = None,
                 id_of: Callable[[dict], str] = lambda doc: doc["id"]):
        super().__init__(daemon=True, name=name)
        self.send, self.document, self.count, self.rate, self.batch, self.gate = send, document, count, rate, batch, gate
        self.id_of = id_of
        self.ids: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        start, paced, seq = time.monotonic(), 0, 0
        try:
            while seq < self.count:
                if self.gate is not None and not self.gate.is_set():
                    self.gate.wait()
                    start, paced = time.monotonic(), 0
                docs = [self.document(i) for i in range(seq, min(seq + self.batch, self.count))]
                self.send(docs)
                self.ids.extend(self.id_of(d) for d in docs)
                seq += len(docs)
                paced += len(docs)
                # Pace to the rate: sleep until this batch's scheduled time.
                delay = start + paced / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        except BaseException as exc:  # reported by the caller
            self.error = exc


class IngestPublisher(PacedProducer):
    """Publishes documents {id, seq} through a live peer's Ingest service (gRPC) at a steady rate (the demo)."""

    def __init__(self, cluster: LocalCluster, count: int, rate: float, batch: int = 50, prefix: str = "m",
                 document: Callable[[int], dict] | None = None):
        """``document(seq)`` builds message ``seq`` (default ``{id, seq}``)."""
        super().__init__("publisher", self._send, document or (lambda seq: {"id": f"{prefix}{seq:07d}", "seq": seq}),
                         count, rate, batch)
        self.cluster = cluster

    def _send(self, docs: list[dict]) -> None:
        bodies = [json.dumps(d).encode() for d in docs]
        # Any live peer's Ingest will do; if the one we picked dies, try another.
        deadline = time.monotonic() + 30
        while True:
            addr = self.cluster.live_address()
            if addr:
                try:
                    publish(addr, self.cluster.flow, bodies, timeout_s=5.0)
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.05)


class DrillProducer(PacedProducer):
    """Publishes orders and payments through ``cluster.publish`` at ``rate`` (the drills); waits
    (and restarts its pacing) while ``gate`` is clear."""

    def __init__(self, cluster: LocalCluster, total: int, rate: float, gate: threading.Event, batch: int = 50):
        super().__init__("drill-producer", cluster.publish, order_or_payment, total, rate, batch, gate)


class UplinkPublisher:
    """Writes documents to an uplink in pipelines; remembers each one's uplink time (the benches)."""

    def __init__(self, client: redis.Redis, uplink: str, document):
        self.r, self.uplink, self.document = client, uplink, document
        self.seq = 0
        self.written_ms: dict[str, int] = {}
        self.last = ""

    def publish(self, n: int) -> None:
        for i in range(0, n, _PUBLISH_CHUNK):
            docs = [self.document(self.seq + j) for j in range(min(_PUBLISH_CHUNK, n - i))]
            self.seq += len(docs)
            pipe = self.r.pipeline(transaction=False)
            for d in docs:
                pipe.xadd(self.uplink, {"data": json.dumps(d, separators=(",", ":"))})
            for d, pos in zip(docs, pipe.execute()):
                pos = pos.decode()
                self.written_ms.setdefault(d["id"], position_order(pos)[0])  # a re-sent ID counts from its first send
                self.last = pos

    def steady(self, rate: float, seconds: float) -> None:
        """Publish at ``rate`` for ``seconds``, in twentieths of a second."""
        start, sent, total = time.monotonic(), 0, int(rate * seconds)
        step = max(1, int(rate / 20))
        while sent < total:
            n = min(step, total - sent)
            self.publish(n)
            sent += n
            ahead = start + sent / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing the producer, not waiting for a condition
