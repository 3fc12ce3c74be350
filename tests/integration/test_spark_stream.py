"""Redis Stream -> Spark -> on_batch, against a real redis-server and a real Spark.

One SparkSession serves the module (start-up costs seconds); every test
uses its own stream key, status key and checkpoint directory. The reader's
outage and pause behaviour is tested in-process, without Spark, through a
small TCP forwarder that plays a Redis which is down and then comes up.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest
import redis
from pyspark.sql import SparkSession

from twinflow.runtime.spark.session import build_session
from twinflow.runtime.spark.source import RedisStreamReader
from twinflow.runtime.spark.stream import start_stream, stop_stream

# The first micro-batch of a query includes JIT and worker start-up (seconds).
DEADLINE_S = 45.0


def wait_until(predicate, what: str, timeout_s: float = DEADLINE_S, query=None):
    """Poll ``predicate`` until truthy; fail at the deadline, or at once if ``query`` died."""
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if query is not None and not query.isActive:
            raise AssertionError(f"query ended while waiting for {what}: {query.exception()}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.02)


class Collector:
    """on_batch target; remembers batches in arrival order."""

    def __init__(self, fail_first: bool = False) -> None:
        self.batches: list[tuple[int, list]] = []
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self, batch_id: int, rows: list) -> None:
        with self._lock:
            self.batches.append((batch_id, rows))
            if self.fail_first:
                self.fail_first = False
                raise RuntimeError("on_batch refused the batch")

    @property
    def rows(self) -> list:
        with self._lock:
            return [row for _, rows in self.batches for row in rows]


@pytest.fixture(scope="module")
def spark():
    # Leave alone a session some other fixture started; stop only our own.
    ours = SparkSession.getActiveSession() is None
    session = build_session("twinflow-test-spark-stream")
    yield session
    if ours:
        session.stop()


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def key() -> str:
    return "test:spark:" + uuid.uuid4().hex[:10]


def add(r, key: str, payloads: list) -> list[str]:
    """XADD payloads (bytes, or None for an entry without a data field); return IDs."""
    ids: list[str] = []
    for start in range(0, len(payloads), 500):
        pipe = r.pipeline(transaction=False)
        for payload in payloads[start : start + 500]:
            pipe.xadd(key, {"data": payload} if payload is not None else {"other": b"x"})
        ids.extend(i.decode() for i in pipe.execute())
    return ids


def payloads(first: int, count: int) -> list:
    # Every 97th entry has no data field: it must arrive as None, not vanish.
    return [None if i % 97 == 0 else b"m%d" % i for i in range(first, first + count)]


def test_every_entry_reaches_on_batch_once_in_order(spark, r, redis_url, key, tmp_path):
    sent = payloads(0, 3000)
    ids = add(r, key, sent)
    got = Collector()
    query = start_stream(
        spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
        on_batch=got, status_key=key + ":status", query_name="t_once_" + key[-10:],
    )
    try:
        wait_until(lambda: len(got.rows) >= 3000, "the 3,000 added before start", query=query)
        for first in range(3000, 5000, 500):  # added while the query runs
            more = payloads(first, 500)
            sent += more
            ids += add(r, key, more)
        wait_until(lambda: len(got.rows) >= 5000, "the 2,000 added while running", query=query)

        # read_n moves only after a batch is processed and committed, so once
        # it reaches 5,000 any duplicate would already be in got.rows.
        status = wait_until(
            lambda: (s := r.hgetall(key + ":status")).get(b"read_n") == b"5000" and s,
            "status read_n = 5000",
        )
        assert got.rows == list(zip(ids, sent))
        assert status[b"read_id"].decode() == ids[-1]
        assert r.xinfo_stream(key)["entries-added"] - int(status[b"read_n"]) == 0
        batch_ids = [b for b, _ in got.batches]
        assert batch_ids == sorted(set(batch_ids))
        assert all(0 < len(rows) <= 2000 for _, rows in got.batches)
        assert query.exception() is None
    finally:
        assert stop_stream(query, 10)


def test_restart_from_checkpoint_delivers_nothing_twice(spark, r, redis_url, key, tmp_path):
    def run(collector):
        return start_stream(
            spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
            on_batch=collector, status_key=key + ":status", batch_size=40,
        )

    ids = add(r, key, payloads(0, 100))
    before = Collector()
    query = run(before)
    try:
        wait_until(lambda: len(before.rows) >= 100, "the first 100 entries", query=query)
    finally:
        # Right after on_batch saw the last rows: the stop must wait for the
        # commit, or the restart would deliver that batch again.
        assert stop_stream(query, 10)
    assert r.hget(key + ":status", "read_n") == b"100"

    ids += add(r, key, payloads(100, 50))  # while no query runs
    after = Collector()
    query = run(after)
    try:
        wait_until(lambda: len(after.rows) >= 50, "entries added while stopped", query=query)
        ids += add(r, key, payloads(150, 50))
        wait_until(lambda: r.hget(key + ":status", "read_n") == b"200", "read_n = 200")
        assert [p for p, _ in before.rows] == ids[:100]
        assert [p for p, _ in after.rows] == ids[100:]
        # Batch IDs continue from the checkpoint instead of starting over.
        assert after.batches[0][0] > before.batches[-1][0]
    finally:
        assert stop_stream(query, 10)


def test_on_batch_error_fails_query_and_batch_is_redelivered(spark, r, redis_url, key, tmp_path):
    def run(collector):
        return start_stream(
            spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
            on_batch=collector,
        )

    ids = add(r, key, payloads(0, 30))
    failing = Collector(fail_first=True)
    query = run(failing)
    try:
        wait_until(lambda: not query.isActive, "the query to fail")
        assert "on_batch refused the batch" in str(query.exception())
    finally:
        stop_stream(query, 10)

    # The refused batch was never committed: a restart replays it (Spark
    # re-reads it via readBetweenOffsets), same batch ID, same entries.
    again = Collector()
    query = run(again)
    try:
        wait_until(lambda: len(again.rows) >= 30, "the replayed batch", query=query)
        assert again.batches[0] == failing.batches[0]
        assert [p for p, _ in again.rows] == ids
    finally:
        assert stop_stream(query, 10)


class Forwarder:
    """Pipes TCP connections on ``port`` to ``target``: a Redis that can come up late."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()

    def close(self) -> None:
        self.server.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_reader_waits_for_redis_to_come_up_and_says_so(r, redis_url, key, caplog):
    ids = add(r, key, [b"a", None, b"c"])
    port = free_port()
    reader = RedisStreamReader(
        {"url": f"redis://127.0.0.1:{port}/0", "stream": key, "block_ms": "0"}
    )
    parts = urlsplit(redis_url)
    forwarders: list[Forwarder] = []
    # Nothing listens on ``port`` for the first second: "Redis is down".
    later = threading.Timer(
        1.0, lambda: forwarders.append(Forwarder(port, (parts.hostname, parts.port)))
    )
    later.start()
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="twinflow.runtime.spark.source"):
            rows, end = reader.read(reader.initialOffset())
    finally:
        later.cancel()
        later.join()
        for forwarder in forwarders:
            forwarder.close()
    assert time.monotonic() - began >= 0.9
    assert list(rows) == [(ids[0], b"a"), (ids[1], None), (ids[2], b"c")]
    assert end == {"id": ids[2], "n": 3}
    assert "waiting for Redis" in caplog.text and "answers again" in caplog.text


def test_reader_gives_up_only_after_its_deadline(key):
    reader = RedisStreamReader(
        {"url": f"redis://127.0.0.1:{free_port()}/0", "stream": key, "connect_deadline_s": "1.5"}
    )
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="gave up after"):
        reader.read(reader.initialOffset())
    assert 1.4 <= time.monotonic() - began < 5


def test_paused_reader_plans_nothing_but_still_replays(r, redis_url, key, tmp_path):
    ids = add(r, key, payloads(0, 5))
    pause = tmp_path / "pause"
    reader = RedisStreamReader({"url": redis_url, "stream": key, "pause_file": str(pause)})
    rows, first = reader.read(reader.initialOffset())
    assert [p for p, _ in rows] == ids
    ids += add(r, key, payloads(5, 3))
    pause.touch()
    rows, end = reader.read(first)
    assert list(rows) == [] and end == first
    assert json.loads((tmp_path / "pause.ack").read_text()) == first
    # A replay must still return the batch's entries, pause or not.
    replay = reader.readBetweenOffsets(reader.initialOffset(), first)
    assert [p for p, _ in replay] == ids[:5]
