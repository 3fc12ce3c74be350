"""The shard source on real Spark and Redis: each shard with new entries is one partition read by
a task, entries keep their order per shard, a held shard waits while the others read, and a
restarted query warms up again and resumes each shard after its last batch."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis
from pyspark.sql import SparkSession

from tests.conftest import wait_until
from twinflow.runtime.spark.session import build_session
from twinflow.runtime.spark.shard_source import WARMUP_SHARD
from twinflow.runtime.spark.stream import hold_shards, shard_hold_state, start_shard_stream, stop_stream


@pytest.fixture(scope="module")
def spark():
    ours = SparkSession.getActiveSession() is None
    session = build_session("twinflow-test-shard-source", "local[2]")
    yield session
    if ours:
        session.stop()


class Frames:
    """``on_frame``: each batch's rows (shard, position, data) and partition count, as Spark gave them."""

    def __init__(self):
        self.batches: list[tuple[int, int, list[tuple]]] = []
        self._lock = threading.Lock()

    def __call__(self, frame, batch_id: int) -> None:
        table = frame.toArrow()
        rows = list(zip(*(table.column(i).to_pylist() for i in range(3))))
        with self._lock:
            self.batches.append((batch_id, frame.rdd.getNumPartitions(), rows))

    def rows(self, shard: int) -> list[tuple]:
        with self._lock:
            return [(p, d) for _, _, rows in self.batches for s, p, d in rows if s == shard]

    def warmups(self) -> int:
        with self._lock:
            return sum(1 for _, _, rows in self.batches for s, _, _ in rows if s == WARMUP_SHARD)


def test_shards_are_partitions_in_order_held_one_by_one_and_resumed_after_a_restart(spark, redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)
    streams = [f"test:shards:{uuid.uuid4().hex[:8]}:{k}" for k in range(2)]

    def add(k: int, first: int, n: int) -> list[str]:
        pipe = r.pipeline(transaction=False)
        for i in range(first, first + n):
            pipe.xadd(streams[k], {"data": b"s%d-%d" % (k, i)})
        return [p.decode() for p in pipe.execute()]

    def start(frames: Frames):
        return start_shard_stream(spark, redis_url=redis_url, shards=[{"stream": s} for s in streams],
                                  checkpoint_dir=str(tmp_path / "checkpoint"), on_frame=frames,
                                  max_batch_size=300)

    first = [add(0, 0, 500), add(1, 0, 200)]
    frames = Frames()
    query = start(frames)
    try:
        wait_until(lambda: len(frames.rows(0)) == 500 and len(frames.rows(1)) == 200, 60, what="both shards read")
        assert frames.warmups() == 1
        assert [p for p, _ in frames.rows(0)] == first[0] and [p for p, _ in frames.rows(1)] == first[1]
        assert frames.rows(1)[0][1] == b"s1-0"
        # A batch holds at most max_batch_size entries per shard, one partition per shard with entries.
        data = [(n, rows) for _, n, rows in frames.batches if any(s >= 0 for s, _, _ in rows)]
        assert all(sum(1 for s, _, _ in rows if s == k) <= 300 for _, rows in data for k in (0, 1))
        assert any(n == 2 for n, rows in data if {s for s, _, _ in rows} == {0, 1})

        hold_shards(query, {1})
        wait_until(lambda: shard_hold_state(query) == {1}, 10, what="the planner holding shard 1")
        held = add(1, 200, 50)  # added first: a plan that took shard 0's would take these too
        add(0, 500, 50)
        wait_until(lambda: len(frames.rows(0)) == 550, 30, what="shard 0 read while shard 1 is held")
        assert len(frames.rows(1)) == 200
        hold_shards(query, set())
        wait_until(lambda: shard_hold_state(query) == set(), 10, what="the hold lifted")
        wait_until(lambda: len(frames.rows(1)) == 250, 30, what="shard 1 read once released")
        assert [p for p, _ in frames.rows(1)[200:]] == held
    finally:
        stop_stream(query, 10.0)

    # A restart resumes each shard after its last batch, warming up again (a new count).
    again = Frames()
    more = add(1, 250, 10)
    query = start(again)
    try:
        wait_until(lambda: again.warmups() == 1 and len(again.rows(1)) == 10, 60, what="the restarted query")
        assert [p for p, _ in again.rows(1)] == more and again.rows(0) == []
    finally:
        stop_stream(query, 10.0)


def test_packed_rows_carry_every_entry_of_their_shard_in_order(spark, redis_url, tmp_path):
    """With ``pack``, a partition holds its shard's entries N to a row; unpacked, exactly the
    entries planned, in uplink order, as a sharded flow's task reads them (``partition_rows``)."""
    from twinflow.cluster.shard_task import partition_rows

    r = redis.Redis.from_url(redis_url)
    streams = [f"test:packed:{uuid.uuid4().hex[:8]}:{k}" for k in range(2)]
    sent = {k: [r.xadd(streams[k], {"data": b"s%d-%d" % (k, i)}).decode() for i in range(25 + 10 * k)]
            for k in range(2)}
    seen: dict[int, list[tuple]] = {0: [], 1: []}
    packed_rows: list[int] = []
    lock = threading.Lock()

    def on_frame(frame, batch_id: int) -> None:
        table = frame.toArrow()
        with lock:
            packed_rows.append(table.num_rows)
            for k, rows in partition_rows(table.to_batches(), packed=True).items():
                if k != WARMUP_SHARD:
                    seen[k].extend(rows)

    query = start_shard_stream(spark, redis_url=redis_url, shards=[{"stream": s} for s in streams],
                               checkpoint_dir=str(tmp_path / "checkpoint"), on_frame=on_frame,
                               max_batch_size=300, pack=4)
    try:
        wait_until(lambda: all(len(seen[k]) == len(sent[k]) for k in (0, 1)), 60, what="both shards read")
    finally:
        stop_stream(query, 10.0)
    for k in (0, 1):
        assert [p for p, _, _ in seen[k]] == sent[k]
        assert [d for _, d, _ in seen[k]] == [b"s%d-%d" % (k, i) for i in range(len(sent[k]))]
    assert sum(packed_rows) < sum(len(v) for v in sent.values())  # 4 entries a row, not one
