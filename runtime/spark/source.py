"""Redis Stream as a Spark streaming source (PySpark Python Data Source API).

Register once per session, then read with the format name::

    register_source(spark)              # build_session() does this
    df = (spark.readStream.format("twinflow_redis_stream")
          .option("url", "redis://127.0.0.1:6379/0")
          .option("stream", "flow:uplink:0")
          .load())                      # position STRING, data BINARY

Options: ``url``, ``stream`` (required); ``batch_size`` (max entries per
micro-batch, default 2000); ``status_key`` (a hash, one per reader, that gets
``read_n`` and ``read_id`` once a batch is processed, so ``XINFO STREAM``'s
entries-added minus ``read_n`` is the exact backlog); ``connect_deadline_s``
(default 300); ``block_ms`` (how long one read waits in Redis for new entries
when there are none, default 100; 0 = poll); ``pause_file`` (set by
``stream.start_stream``: once the file exists, no new batch is planned and
``<pause_file>.ack`` says so); ``warmup`` ("1": the first read of each query
run returns one synthetic row at position ``WARMUP_POSITION`` with no data,
so the query pays its cold first batch, 5-12 s measured, at start rather
than on the first real message, and the caller learns when it is ready).

Offsets are ``{"id": <last entry id read>, "n": <entries read so far>}`` and
Spark checkpoints them, so a restarted query resumes right after the last
entry of the last planned batch. The stream is never trimmed or acknowledged
here: entries stay for other readers and for replay.

Under failure:

- Redis unreachable, timing out or still loading: every call waits and
  retries (backoff up to 1 s), logging what it waits for, and only raises
  after ``connect_deadline_s`` of continuous failure. A read never turns an
  outage into "no data" without saying so.
- Replay after a crash: ``readBetweenOffsets`` re-reads by entry ID, so the
  replayed batch holds the same entries in the same order, provided nobody
  trimmed them from the stream meanwhile (a shortfall is logged).
- An entry without a ``data`` field is delivered with ``data`` = None, never
  dropped; the flow routes it to a failure outlink.

Where the code runs (PySpark 4.3, classic): ``read``/``commit`` run in a
long-lived Python worker that the driver JVM forks per query (not the
driver's own Python process); ``readBetweenOffsets`` runs only on replay, in
an executor's Python worker, so executors must reach Redis too. Needs Redis
6.2+ for exclusive XRANGE bounds.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Iterator, Tuple
from urllib.parse import urlsplit

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

log = logging.getLogger(__name__)

SOURCE_NAME = "twinflow_redis_stream"
SCHEMA = StructType(
    [StructField("position", StringType(), False), StructField("data", BinaryType(), True)]
)
DEFAULT_BATCH_SIZE = 2000
WARMUP_POSITION = "warmup"  # never a Redis entry ID, which is always "<ms>-<seq>"
DEFAULT_CONNECT_DEADLINE_S = 300.0
DEFAULT_BLOCK_MS = 100
_MAX_BACKOFF_S = 1.0
_LOG_EVERY_S = 10.0

Row = Tuple[str, "bytes | None"]


def register_source(spark: Any) -> None:
    """Make ``format("twinflow_redis_stream")`` available in ``spark``."""
    spark.dataSource.register(RedisStreamDataSource)


def _where(url: str) -> str:
    # For logs: host, port and db only; a URL may carry a password.
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"


class RedisStreamDataSource(DataSource):
    """Reads one Redis Stream in entry-ID order; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def simpleStreamReader(self, schema: StructType) -> "RedisStreamReader":
        return RedisStreamReader(dict(self.options))


class RedisStreamReader(SimpleDataSourceStreamReader):
    """One reader per query; keeps one Redis client, created on first use."""

    def __init__(self, options: dict) -> None:
        for required in ("url", "stream"):
            if not options.get(required):
                raise ValueError(f"{SOURCE_NAME}: option {required!r} is required")
        self.url = options["url"]
        self.stream = options["stream"]
        self.batch_size = int(options.get("batch_size") or DEFAULT_BATCH_SIZE)
        if self.batch_size < 1:
            raise ValueError(f"{SOURCE_NAME}: batch_size must be >= 1, got {self.batch_size}")
        self.status_key = options.get("status_key") or None
        self.connect_deadline_s = float(
            options.get("connect_deadline_s") or DEFAULT_CONNECT_DEADLINE_S
        )
        self.block_ms = int(options.get("block_ms") or DEFAULT_BLOCK_MS)
        self.pause_file = options.get("pause_file") or None
        self._warmup_due = options.get("warmup") == "1"
        self._client = None
        self._recorded_n = -1
        self._reading_from: dict = {}
        self._pause_acked = False

    def __getstate__(self) -> dict:
        # Spark pickles readers to ship them to workers; sockets don't travel.
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def initialOffset(self) -> dict:
        return {"id": "0-0", "n": 0}

    def read(self, start: dict) -> Tuple[Iterator[Row], dict]:
        # Spark runs one batch at a time and asks for the next only after the
        # previous one is processed and logged as committed, so reaching here
        # proves everything up to ``start`` is done.
        self._reading_from = start
        try:
            # commit() alone lags: Spark calls it only when it plans the *next*
            # data batch, so an idle or stopped stream would show its last
            # batch unread.
            self._record_progress(start, pausable=True)
            self._check_pause()
            entries = self._redis(
                "read new entries",
                lambda r: r.xrange(self.stream, min="(" + start["id"], count=self.batch_size),
                pausable=True,
            )
            if not entries and self.block_ms:
                # Nothing new: wait in Redis rather than let Spark poll every
                # 10 ms (about 20% of a core per idle query, measured). A new
                # entry still comes back at once.
                reply = self._redis(
                    "wait for new entries",
                    lambda r: r.xread(
                        {self.stream: start["id"]}, count=self.batch_size, block=self.block_ms
                    ),
                    pausable=True,
                )
                entries = reply[0][1] if reply else []
        except _Paused:
            return iter(()), start
        if self._warmup_due:
            # Only a changed offset makes Spark run a batch; the token changes
            # nothing else (same id, same n) and is dropped by the next batch.
            self._warmup_due = False
            return iter([(WARMUP_POSITION, None)]), {**start, "warmup": os.urandom(4).hex()}
        if not entries:
            return iter(()), start
        rows = [_row(entry) for entry in entries]
        # A list iterator, not a generator: Spark's wrapper copy.copy()s it.
        return iter(rows), {"id": rows[-1][0], "n": int(start["n"]) + len(rows)}

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[Row]:
        rows: list[Row] = []
        after = start["id"]
        while True:
            entries = self._redis(
                "re-read a planned batch",
                lambda r: r.xrange(
                    self.stream, min="(" + after, max=end["id"], count=self.batch_size
                ),
            )
            rows.extend(_row(entry) for entry in entries)
            if len(entries) < self.batch_size:
                break
            after = rows[-1][0]
        expected = int(end["n"]) - int(start["n"])
        if len(rows) != expected:
            log.warning(
                "%s: replay of %s..%s found %d entries, the batch had %d (stream trimmed?)",
                self.stream, start["id"], end["id"], len(rows), expected,
            )
        return iter(rows)

    def commit(self, end: dict) -> None:
        self._record_progress(end)

    def _record_progress(self, done: dict, pausable: bool = False) -> None:
        n = int(done["n"])
        if not self.status_key or n <= self._recorded_n:
            return
        mapping = {"read_n": n, "read_id": done["id"]}
        self._redis(
            "record the read offset",
            lambda r: r.hset(self.status_key, mapping=mapping),
            pausable=pausable,
        )
        self._recorded_n = n

    def _check_pause(self) -> None:
        """Raise _Paused (after acknowledging) once the pause file exists.

        Checked in read() only: a paused reader plans no more batches, and
        since read(start) means every batch up to ``start`` is committed, the
        acknowledgement tells stop_stream that stopping now cuts nothing short.
        """
        if not self.pause_file or not os.path.exists(self.pause_file):
            return
        if not self._pause_acked:
            with open(self.pause_file + ".ack", "w") as ack:
                ack.write(json.dumps(self._reading_from))
            self._pause_acked = True
        raise _Paused()

    def _redis(self, what: str, call: Any, pausable: bool = False) -> Any:
        """Run ``call(client)``; wait out connection trouble up to the deadline.

        ``pausable`` calls give up waiting (raise _Paused) once a pause is asked.
        """
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        if self._client is None:
            # No client-side retries: this loop owns waiting, so it can log and
            # keep to one deadline.
            self._client = redis.Redis.from_url(
                self.url, retry=Retry(NoBackoff(), 0), socket_timeout=10, socket_connect_timeout=2,
                decode_responses=False,
            )
        began = time.monotonic()
        next_log = began
        delay = 0.05
        while True:
            try:
                result = call(self._client)
                if next_log > began:
                    log.warning(
                        "%s: Redis at %s answers again after %.1fs",
                        SOURCE_NAME, _where(self.url), time.monotonic() - began,
                    )
                return result
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                now = time.monotonic()
                waited = now - began
                if waited >= self.connect_deadline_s:
                    raise RuntimeError(
                        f"{SOURCE_NAME}: gave up after {waited:.0f}s waiting for Redis at "
                        f"{_where(self.url)} to {what} on stream {self.stream!r}: {exc}"
                    ) from exc
                if now >= next_log:
                    log.warning(
                        "%s: waiting for Redis at %s to %s on stream %r (%.0fs so far, "
                        "giving up after %.0fs): %s",
                        SOURCE_NAME, _where(self.url), what, self.stream, waited,
                        self.connect_deadline_s, exc,
                    )
                    next_log = now + _LOG_EVERY_S
                time.sleep(min(delay, self.connect_deadline_s - waited))
                delay = min(delay * 2, _MAX_BACKOFF_S)
                if pausable:
                    self._check_pause()


class _Paused(Exception):
    """A pause was asked for: read() reports no new data from now on."""


def _row(entry: tuple) -> Row:
    entry_id, fields = entry
    return entry_id.decode(), fields.get(b"data")
