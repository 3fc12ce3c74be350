"""Redis Stream -> Spark -> on_batch, against a real redis-server and a real Spark.

One SparkSession serves the module (start-up costs seconds); every test
uses its own stream key, status key and checkpoint directory. The reader's
outage, pause, hold and replay behaviour is also tested in-process, without
Spark (the outage through ``chaos.fault_link.FaultLink`` playing a Redis that
is down and then comes up).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest
import redis
from pyspark.sql import SparkSession

from twinflow.chaos.fault_link import FaultLink
from twinflow.testing.servers import free_port
from twinflow.runtime.spark.session import build_session
from twinflow.runtime.positions import SKIPPED_SIZE, WARMUP_POSITION
from twinflow.runtime.spark.packed_rows import unpack_rows
from twinflow.runtime.spark import source
from twinflow.runtime.store import scripts
from twinflow.runtime.spark.source import RedisStreamReader
from twinflow.runtime.spark.source_options import DEFAULT_MAX_BODY_BYTES
from twinflow.runtime.spark.logged_batch import LoggedBatches, logged_offset
from twinflow.runtime.spark.stream import batch_reads, hold_stream, hold_state, start_stream, stop_stream

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


def expected(ids: list[str], sent: list, max_body: int = DEFAULT_MAX_BODY_BYTES) -> list:
    """The rows the source delivers for these entries: (position, data, size)."""
    return [
        (i, None if p is None or len(p) > max_body else p, None if p is None else len(p))
        for i, p in zip(ids, sent)
    ]


def body_bytes(rows: list) -> int:
    return sum(len(data) for _, data, _ in rows if data is not None)


def read_all(reader: RedisStreamReader) -> list[tuple[dict, dict, list]]:
    """(start, end, rows) of every batch the reader plans until nothing is new."""
    batches = []
    start = reader.initialOffset()
    while True:
        rows, end = reader.read(start)
        rows = list(rows)
        if not rows:
            return batches
        batches.append((start, end, rows))
        start = end


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
        assert got.rows == expected(ids, sent)
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
    # The offset and commit logs are there, without Hadoop's .crc companion files (session.py).
    assert list((tmp_path / "ck" / "commits").iterdir())
    assert not list((tmp_path / "ck").rglob("*.crc"))

    ids += add(r, key, payloads(100, 50))  # while no query runs
    after = Collector()
    query = run(after)
    try:
        wait_until(lambda: len(after.rows) >= 50, "entries added while stopped", query=query)
        ids += add(r, key, payloads(150, 50))
        wait_until(lambda: r.hget(key + ":status", "read_n") == b"200", "read_n = 200")
        assert [row[0] for row in before.rows] == ids[:100]
        assert [row[0] for row in after.rows] == ids[100:]
        # Batch IDs continue from the checkpoint instead of starting over.
        assert after.batches[0][0] > before.batches[-1][0]
        # Every batch was read by the driver between its logged offsets, none collected.
        reads = batch_reads(query)
        assert reads["by_offsets"] >= 2 and reads["collected"] == 0
    finally:
        assert stop_stream(query, 10)


def test_on_batch_error_fails_query_and_batch_is_redelivered(spark, r, redis_url, key, tmp_path):
    def run(collector):
        return start_stream(
            spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
            on_batch=collector, batch_bytes=2000, max_body_bytes=1000,
        )

    # The first batch is cut by bytes (600 + 1000 + 300 delivered; the next
    # 400 would make 2,300) and holds a withheld body and one without data.
    sent = [b"a" * 600, b"b" * 5000, None, b"c" * 1000, b"d" * 300] + payloads(1, 25)
    sent[5] = b"e" * 400
    ids = add(r, key, sent)
    failing = Collector(fail_first=True)
    query = run(failing)
    try:
        wait_until(lambda: not query.isActive, "the query to fail")
        assert "on_batch refused the batch" in str(query.exception())
    finally:
        stop_stream(query, 10)
    assert failing.batches[0][1] == expected(ids[:5], sent[:5], max_body=1000)

    # The refused batch was never committed: a restart replays it (Spark
    # re-reads it via readBetweenOffsets), same batch ID, same rows.
    again = Collector()
    query = run(again)
    try:
        wait_until(lambda: len(again.rows) >= 30, "the replayed batch", query=query)
        assert again.batches[0] == failing.batches[0]
        assert again.rows == expected(ids, sent, max_body=1000)
    finally:
        assert stop_stream(query, 10)


def test_batches_respect_entry_and_byte_bounds(spark, r, redis_url, key, tmp_path):
    batch_size, batch_bytes, max_body = 25, 8000, 10000
    rng = random.Random(7)
    sent: list = [bytes([i % 251]) * rng.randint(0, 2500) for i in range(240)]
    for i in range(0, 240, 37):
        sent[i] = None
    sent[50] = b"s" * 9000  # alone in its batch: over batch_bytes, under max_body
    sent[51] = b"t" * 7900
    sent[90] = b"w" * 12000  # withheld: arrives as its size only, counts 0
    sent[91] = b"W" * 300_000
    sent[150:180] = [b""] * 30  # empty bodies: 30 entries, 0 bytes, cut by count
    ids = add(r, key, sent)  # all there before the first batch is planned
    got = Collector()
    query = start_stream(
        spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
        on_batch=got, batch_size=batch_size, batch_bytes=batch_bytes, max_body_bytes=max_body,
    )
    try:
        wait_until(lambda: len(got.rows) >= len(sent), "every entry", query=query)
    finally:
        assert stop_stream(query, 10)

    assert got.rows == expected(ids, sent, max_body=max_body)  # each once, in order
    batches = [rows for _, rows in got.batches]
    for rows, following in zip(batches, batches[1:] + [[]]):
        assert 1 <= len(rows) <= batch_size
        assert body_bytes(rows) <= batch_bytes or len(rows) == 1, rows[0][0]
        if following:
            # Each batch is as large as the bounds allow: the next entry did not fit.
            assert len(rows) == batch_size or body_bytes(rows + following[:1]) > batch_bytes
    assert [(p, s) for p, data, s in got.rows if data is None] == [
        (ids[i], None if sent[i] is None else len(sent[i]))
        for i in range(len(sent)) if sent[i] is None or len(sent[i]) > max_body
    ]
    assert [ids[50]] in [[row[0] for row in rows] for rows in batches]
    assert any(len(rows) == batch_size for rows in batches)
    assert any(len(rows) < batch_size for rows in batches[:-1])


def test_over_limit_body_is_withheld_even_when_the_read_waits_for_it(r, redis_url, key):
    big = 16 * 1024 * 1024
    ids = add(r, key, [b"small", b"x" * (3 * 1024 * 1024), None])
    reader = RedisStreamReader({"url": redis_url, "stream": key, "block_ms": "10000"})
    rows, end = reader.read(reader.initialOffset())
    assert list(rows) == [
        (ids[0], b"small", 5), (ids[1], None, 3 * 1024 * 1024), (ids[2], None, None)
    ]

    # Nothing new: the read waits in Redis (XREAD BLOCK). An entry that comes
    # meanwhile must reach the reader withheld, never fetched whole.
    result: list = []
    waiting = threading.Thread(target=lambda: result.append(reader.read(end)))
    waiting.start()
    try:
        wait_until(
            lambda: any(c.get("cmd") == "xread" and "b" in c.get("flags", "")
                        for c in r.client_list()),
            "the reader to block in XREAD",
        )
        sent_before = r.info("stats")["total_net_output_bytes"]
        new_id = r.xadd(key, {"data": b"y" * big}).decode()
        waiting.join(DEADLINE_S)
        sent_by_redis = r.info("stats")["total_net_output_bytes"] - sent_before
    finally:
        waiting.join(DEADLINE_S)
    assert not waiting.is_alive()
    rows, last = result[0]
    assert list(rows) == [(new_id, None, big)]
    assert last["id"] == new_id and last["n"] == 4
    # Socket buffers may take a few MiB before the reader drops the connection;
    # fetching the entry would have sent all 16.
    assert sent_by_redis < big // 2


def test_replay_returns_the_planned_rows_whatever_the_options(r, redis_url, key):
    rng = random.Random(11)
    sent: list = [b"p" * rng.randint(0, 900) for _ in range(150)]
    sent[3], sent[70], sent[71] = None, b"q" * 5000, None
    ids = add(r, key, sent)
    options = {"url": redis_url, "stream": key, "batch_size": "9", "batch_bytes": "2500",
               "max_body_bytes": "800"}
    batches = read_all(RedisStreamReader(options))
    assert [row for _, _, rows in batches for row in rows] == expected(ids, sent, max_body=800)
    assert any(len(rows) < 9 for _, _, rows in batches[:-1])  # some were cut by bytes
    # A replay may run in another process whose options changed since.
    other = RedisStreamReader({**options, "batch_size": "2", "batch_bytes": "1",
                               "max_body_bytes": "100000"})
    for start, end, rows in batches:
        assert list(other.readBetweenOffsets(start, end)) == rows

    warm = RedisStreamReader({**options, "warmup": "1"})
    rows, end = warm.read(batches[-1][1])
    assert list(rows) == [(WARMUP_POSITION, None, None)]
    assert list(warm.readBetweenOffsets(batches[-1][1], end)) == [(WARMUP_POSITION, None, None)]


def test_hold_plans_nothing_until_released(spark, r, redis_url, key, tmp_path, caplog):
    got = Collector()
    query = start_stream(
        spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
        on_batch=got, status_key=key + ":status",
    )
    try:
        ids = add(r, key, payloads(1, 20))
        wait_until(lambda: len(got.rows) >= 20, "the first 20 entries", query=query)
        assert hold_state(query) is None
        assert hold_stream(query, True)
        wait_until(lambda: hold_state(query), "the source to see the hold", query=query)

        ids += add(r, key, payloads(21, 10))
        seen = hold_state(query)["held_reads"]
        state = wait_until(
            lambda: (s := hold_state(query)) and s["held_reads"] >= seen + 3 and s,
            "three more held reads", query=query,
        )
        assert state["offset"]["n"] == 20
        assert [row[0] for row in got.rows] == ids[:20]  # no batch carried the new ones
        assert r.hget(key + ":status", "read_n") == b"20"

        assert hold_stream(query, False)
        assert hold_state(query) is None
        wait_until(lambda: len(got.rows) >= 30, "the entries added while held", query=query)
        assert got.rows == expected(ids, payloads(1, 30))

        # Held again, the query still stops at a batch boundary, and promptly.
        assert hold_stream(query, True)
        wait_until(lambda: hold_state(query), "the source to see the second hold", query=query)
    finally:
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="twinflow.runtime.spark.stream"):
            assert stop_stream(query, 10)
        took = time.monotonic() - began
    assert "did not reach a batch boundary" not in caplog.text
    assert took < 5, took
    assert not hold_stream(query, False)  # a stopped query is no longer ours to hold


def test_reader_waits_for_redis_to_come_up_and_says_so(r, redis_url, key, caplog):
    ids = add(r, key, [b"a", None, b"c"])
    port = free_port()
    reader = RedisStreamReader(
        {"url": f"redis://127.0.0.1:{port}/0", "stream": key, "block_ms": "0"}
    )
    parts = urlsplit(redis_url)
    proxies: list[FaultLink] = []
    # Nothing listens on ``port`` for the first second: "Redis is down".
    later = threading.Timer(
        1.0, lambda: proxies.append(FaultLink((parts.hostname, parts.port), listen_port=port).start())
    )
    later.start()
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="twinflow.runtime.spark.source"):
            rows, end = reader.read(reader.initialOffset())
    finally:
        later.cancel()
        later.join()
        for proxy in proxies:
            proxy.stop()
    assert time.monotonic() - began >= 0.9
    assert list(rows) == [(ids[0], b"a", 1), (ids[1], None, None), (ids[2], b"c", 1)]
    assert end == {"id": ids[2], "n": 3, "max_body": DEFAULT_MAX_BODY_BYTES}
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
    assert [row[0] for row in rows] == ids
    ids += add(r, key, payloads(5, 3))
    pause.touch()
    rows, end = reader.read(first)
    assert list(rows) == [] and end == first
    assert json.loads((tmp_path / "pause.ack").read_text()) == first
    # A replay must still return the batch's entries, pause or not.
    replay = reader.readBetweenOffsets(reader.initialOffset(), first)
    assert [row[0] for row in replay] == ids[:5]


def test_held_reader_waits_acknowledges_and_resumes_on_release(r, redis_url, key, tmp_path):
    ids = add(r, key, payloads(1, 3))
    hold, pause = tmp_path / "hold", tmp_path / "pause"
    options = {"url": redis_url, "stream": key, "hold_file": str(hold), "pause_file": str(pause)}
    reader = RedisStreamReader({**options, "block_ms": "300"})
    start = reader.initialOffset()
    hold.write_text("h1")
    for n in (1, 2):
        began = time.monotonic()
        rows, end = reader.read(start)
        # No data, and not a spin: each held read waits about block_ms.
        assert list(rows) == [] and end == start
        assert time.monotonic() - began >= 0.25
        ack = json.loads((tmp_path / "hold.ack").read_text())
        assert ack == {"hold": "h1", "held_reads": n, "offset": start}

    def read_in_thread(reader, start):
        result: list = []
        thread = threading.Thread(target=lambda: result.append(reader.read(start)))
        thread.start()
        return thread, result

    def acked(token, n=1):
        def check():
            try:
                ack = json.loads((tmp_path / "hold.ack").read_text())
            except (FileNotFoundError, ValueError):
                return False
            return ack["hold"] == token and ack["held_reads"] >= n
        return check

    # A new hold counts afresh; releasing it lets the held read go on at once.
    slow = RedisStreamReader({**options, "block_ms": "20000"})
    hold.write_text("h2")
    thread, result = read_in_thread(slow, start)
    wait_until(acked("h2"), "the reader to acknowledge hold h2")
    assert json.loads((tmp_path / "hold.ack").read_text())["held_reads"] == 1
    hold.unlink()
    released = time.monotonic()
    thread.join(DEADLINE_S)
    assert time.monotonic() - released < 5
    rows, end = result[0]
    assert [row[0] for row in rows] == ids and end["n"] == 3

    # A pause is seen while held, so a held query still stops promptly.
    hold.write_text("h3")
    thread, result = read_in_thread(slow, end)
    wait_until(acked("h3"), "the reader to acknowledge hold h3")
    pause.touch()
    paused = time.monotonic()
    thread.join(DEADLINE_S)
    assert time.monotonic() - paused < 5
    assert list(result[0][0]) == [] and result[0][1] == end
    assert json.loads((tmp_path / "pause.ack").read_text()) == end


def test_batches_grow_under_a_backlog_and_shrink_under_light_load(r, redis_url, key):
    # Admission: after a batch of at least batch_size the next may take up to max_batch_size,
    # and the cap is batch_size again once a batch holds fewer.
    ids = add(r, key, [b"x"] * 200)
    reader = RedisStreamReader({"url": redis_url, "stream": key, "batch_size": "10", "max_batch_size": "50",
                                "block_ms": "1"})
    batches = read_all(reader)
    assert [len(rows) for _, _, rows in batches] == [10, 50, 50, 50, 40]
    assert [row[0] for _, _, rows in batches for row in rows] == ids
    more = add(r, key, [b"y"] * 15)
    rows, end = reader.read(batches[-1][1])  # the last read found nothing: light load reads batch_size
    assert [row[0] for row in rows] == more[:10]
    # A batch short of the grown cap but holding at least batch_size is still a backlog (a burst
    # still arriving): the cap stays grown.
    rows, end = reader.read(end)
    assert [row[0] for row in rows] == more[10:]  # 5 < batch_size: the cap is batch_size again
    burst = add(r, key, [b"b"] * 30)
    rows, end = reader.read(end)
    assert len(list(rows)) == 10
    rows, end = reader.read(end)
    assert [row[0] for row in rows] == burst[10:]  # 20 entries, under the grown cap of 50
    burst = add(r, key, [b"c"] * 45)
    rows, _ = reader.read(end)
    assert [row[0] for row in rows] == burst  # the cap stayed 50 after a batch of 20
    # A replay of a grown batch holds the same entries, whatever the re-reader's own cap.
    replayer = RedisStreamReader({"url": redis_url, "stream": key, "batch_size": "3"})
    start, end, grown = batches[3]
    assert list(replayer.readBetweenOffsets(start, end)) == grown


def test_packed_rows_carry_the_same_entries_and_replay_the_same(r, redis_url, key):
    ids = add(r, key, [b"p%d" % i for i in range(23)])
    r.xadd(key, {"other": b"no data field"})
    plain = RedisStreamReader({"url": redis_url, "stream": key, "batch_size": "100", "block_ms": "1"})
    packed = RedisStreamReader({"url": redis_url, "stream": key, "batch_size": "100", "block_ms": "1",
                                "pack": "10"})
    want, _ = plain.read(plain.initialOffset())
    want = list(want)
    rows, end = packed.read(packed.initialOffset())
    rows = list(rows)
    assert [(n, position) for position, _, n in rows] == [(10, ids[9]), (10, ids[19]), (4, end["id"])]
    columns = [list(c) for c in zip(*rows)]
    assert unpack_rows(*columns) == want and len(want) == 24
    assert list(packed.readBetweenOffsets(packed.initialOffset(), end)) == rows


def test_a_paced_reader_plans_at_most_once_per_interval(r, redis_url, key, tmp_path):
    pace = tmp_path / "pace"
    pace.write_text("400")
    reader = RedisStreamReader({"url": redis_url, "stream": key, "pace_file": str(pace), "block_ms": "1"})
    first = add(r, key, [b"a"] * 5)
    rows, end = reader.read(reader.initialOffset())
    planned = time.monotonic()
    assert [row[0] for row in rows] == first
    second = add(r, key, [b"b"] * 5)
    rows, again = reader.read(end)  # within the interval: nothing planned, the offset stays
    assert list(rows) == [] and again == end

    def planned_again():
        rows, _ = reader.read(end)
        return list(rows)
    rows = wait_until(planned_again, "the next planned batch", timeout_s=5)
    assert time.monotonic() - planned >= 0.4 and [row[0] for row in rows] == second
    pace.write_text("0")  # unpaced (a master): the next batch at once
    third = add(r, key, [b"c"] * 5)
    rows, _ = reader.read({"id": second[-1], "n": 10})
    assert [row[0] for row in rows] == third


def test_a_reader_skips_what_the_mark_says_is_processed_counts_it_and_replays_the_same(r, redis_url, key,
                                                                                         monkeypatch):
    mark_key = key + ":processed"
    options = {"url": redis_url, "stream": key, "batch_size": "100", "block_ms": "1", "skip_key": mark_key,
               "status_key": key + ":read"}
    ids = add(r, key, [b"s%d" % i for i in range(30)])
    reader = RedisStreamReader(options)
    r.set(mark_key, ids[9])  # the first ten are processed
    start = reader.initialOffset()
    rows, end = reader.read(start)
    rows = list(rows)
    assert [row[0] for row in rows] == ids[10:]
    assert end == {"id": ids[-1], "n": 30, "max_body": DEFAULT_MAX_BODY_BYTES, "from": ids[9], "skipped": 10}
    assert list(RedisStreamReader(options).readBetweenOffsets(start, end)) == rows  # a replay: the same ten gone
    # The mark passes every entry read and some not yet read: those are skipped, and the batch
    # says how far it handled the uplink with one row that is no entry.
    more = add(r, key, [b"t%d" % i for i in range(5)])
    r.set(mark_key, more[-1])
    rows, same = reader.read(end)  # within a second of the last batch: not worth one of its own
    assert list(rows) == [] and same == end
    monkeypatch.setattr(source, "SKIP_BATCH_EVERY_S", 0.0)  # (a second later)
    rows, after = reader.read(end)
    assert list(rows) == [(more[-1], None, SKIPPED_SIZE)]
    assert after["id"] == more[-1] and after["n"] == 35
    assert list(reader.readBetweenOffsets(end, after)) == [(more[-1], None, SKIPPED_SIZE)]
    reader.read(after)  # records how far it read: every entry, none left out of the count
    assert r.hget(key + ":read", "read_n") == b"35"
    # A mark behind the reader changes nothing; nor does one in another stream's past.
    r.set(mark_key, ids[0])
    last = add(r, key, [b"u"])
    rows, _ = reader.read(after)
    assert [row[0] for row in rows] == last


def test_reads_from_one_offset_count_processed_entries_once_a_few_at_a_time(r, redis_url, key, monkeypatch):
    mark_key = key + ":processed"
    options = {"url": redis_url, "stream": key, "batch_size": "100", "max_batch_size": "100", "block_ms": "1",
               "skip_key": mark_key}
    monkeypatch.setattr(source, "SKIP_PER_READ", 4)
    told = []  # what each read told READ_BATCH the reads before it from the same offset counted
    real = scripts.read_batch_args
    monkeypatch.setattr(source, "read_batch_args", lambda *a, **kw: told.append(kw.get("counted")) or real(*a, **kw))
    ids = add(r, key, [b"s%d" % i for i in range(12)])
    r.set(mark_key, ids[11])  # all twelve processed
    reader = RedisStreamReader(options)
    # A fresh reader's first skip is a batch (a row that is no entry): four counted, no more.
    rows, first = reader.read(reader.initialOffset())
    assert list(rows) == [(ids[3], None, SKIPPED_SIZE)] and first["n"] == 4
    # Within a second of it, skips are no batch: each read counts on from where the last stopped.
    monkeypatch.setattr(source, "SKIP_BATCH_EVERY_S", 1e9)
    for _ in range(2):
        rows, same = reader.read(first)
        assert list(rows) == [] and same == first
    # The mark taken back behind what was counted (a Redis failover): Redis counts again.
    r.set(mark_key, ids[9])
    rows, same = reader.read(first)
    assert list(rows) == [] and same == first
    r.set(mark_key, ids[11])
    more = add(r, key, [b"t"])
    monkeypatch.setattr(source, "SKIP_BATCH_EVERY_S", 0.0)
    rows, end = reader.read(first)
    rows = list(rows)
    assert told == [None, None, (ids[7], 4), (ids[11], 8), (ids[7], 4)]
    assert [row[0] for row in rows] == more  # every processed entry skipped, each counted once
    assert end["n"] == 13 and end["skipped"] == 8 and end["from"] == ids[11]
    assert list(RedisStreamReader(options).readBetweenOffsets(first, end)) == rows


def test_a_reader_behind_reads_only_entries_older_than_its_read_behind(r, redis_url, key, tmp_path):
    pace = tmp_path / "pace"
    pace.write_text("0 300")
    reader = RedisStreamReader({"url": redis_url, "stream": key, "pace_file": str(pace), "block_ms": "1"})
    ids = add(r, key, [b"b%d" % i for i in range(5)])
    added = time.monotonic()
    rows, end = reader.read(reader.initialOffset())
    assert list(rows) == [] and end == reader.initialOffset()  # younger than 300 ms: not yet

    def read_some():
        rows, _ = reader.read(reader.initialOffset())
        return list(rows)
    rows = wait_until(read_some, "the entries once older than the read-behind", timeout_s=5)
    assert [row[0] for row in rows] == ids and time.monotonic() - added >= 0.3
    pace.write_text("0 0")  # a master's: every entry at once
    more = add(r, key, [b"c"])
    rows, _ = reader.read({"id": ids[-1], "n": 5})
    assert [row[0] for row in rows] == more


def test_a_batch_read_by_its_logged_offsets_is_the_batch_delivered(spark, r, redis_url, key, tmp_path):
    sent = payloads(0, 700) + [b"x" * 3000]
    ids = add(r, key, sent)
    got = Collector()
    options = {"url": redis_url, "stream": key, "batch_size": "200", "max_body_bytes": "1000"}
    query = start_stream(spark, redis_url=redis_url, stream=key, checkpoint_dir=str(tmp_path / "ck"),
                         on_batch=got, batch_size=200, max_body_bytes=1000)
    try:
        wait_until(lambda: len(got.rows) >= len(sent), "every entry", query=query)
    finally:
        assert stop_stream(query, 10)
    assert got.rows == expected(ids, sent, max_body=1000)
    # Read again afterwards, as a restarted driver would: the same rows, batch by batch.
    again = LoggedBatches(str(tmp_path / "ck"), RedisStreamReader(options))
    assert [(b, again.rows(b)) for b, _ in got.batches] == got.batches
    assert again.counts == {"by_offsets": len(got.batches), "collected": 0}


def test_an_offset_log_the_driver_cannot_be_sure_of_is_not_read(tmp_path, redis_url, key):
    offsets = tmp_path / "ck" / "offsets"
    offsets.mkdir(parents=True)
    good = '{"id": "5-0", "n": 3, "max_body": 10}'
    (offsets / "0").write_text(f"v1\n{{}}\n{good}")
    (offsets / "1").write_text(f"v2\n{{}}\n{good}")               # another format
    (offsets / "2").write_text(f"v1\n{{}}\n{good}\n{good}")       # two sources
    (offsets / "3").write_text("v1\n{}\n[1, 2]")                 # not this source's offset
    assert logged_offset(str(tmp_path / "ck"), 0) == {"id": "5-0", "n": 3, "max_body": 10}
    assert [logged_offset(str(tmp_path / "ck"), b) for b in (1, 2, 3, 4)] == [None] * 4
    reader = RedisStreamReader({"url": redis_url, "stream": key})
    # Batch 5's start (batch 4's end) is not logged: collect it from Spark instead.
    (offsets / "5").write_text(f"v1\n{{}}\n{good}")
    logged = LoggedBatches(str(tmp_path / "ck"), reader)
    assert logged.rows(5) is None and LoggedBatches(str(tmp_path / "nowhere"), reader).rows(0) is None
    assert logged.counts == {"by_offsets": 0, "collected": 1}
