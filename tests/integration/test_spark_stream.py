"""Redis Stream -> Spark -> on_batch, against a real redis-server and a real Spark.

One SparkSession serves the module (start-up costs seconds); every test
uses its own stream key, status key and checkpoint directory.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from twinflow.runtime.spark.session import build_session
from twinflow.runtime.spark.stream import start_stream, stop_stream

# The first micro-batch of a query includes JIT and worker start-up (seconds).
DEADLINE_S = 45.0


def wait_until(predicate, what: str, timeout_s: float = DEADLINE_S):
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
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
    session = build_session("twinflow-test-spark-stream")
    yield session
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
        wait_until(lambda: len(got.rows) >= 3000, "the 3,000 entries added before start")
        for first in range(3000, 5000, 500):  # added while the query runs
            more = payloads(first, 500)
            sent += more
            ids += add(r, key, more)
        wait_until(lambda: len(got.rows) >= 5000, "the 2,000 entries added while running")

        # read_n is committed after on_batch returns, so once it reaches 5,000
        # every batch is in and any duplicate would already be in got.rows.
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
        wait_until(lambda: len(before.rows) >= 100, "the first 100 entries")
    finally:
        assert stop_stream(query, 10)

    ids += add(r, key, payloads(100, 50))  # while no query runs
    after = Collector()
    query = run(after)
    try:
        wait_until(lambda: len(after.rows) >= 50, "entries added while stopped")
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
        wait_until(lambda: len(again.rows) >= 30, "the replayed batch")
        assert again.batches[0] == failing.batches[0]
        assert [p for p, _ in again.rows] == ids
    finally:
        assert stop_stream(query, 10)
