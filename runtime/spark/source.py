"""Redis Stream as a Spark streaming source (PySpark Python Data Source API).

Register once per session, then read with the format name::

    spark.dataSource.register(RedisStreamDataSource)
    df = (spark.readStream.format("twinflow_redis_stream")
          .option("url", "redis://127.0.0.1:6379/0")
          .option("stream", "flow:uplink:0")
          .load())                      # position STRING, data BINARY

Options: ``url``, ``stream`` (required); ``batch_size`` (max entries per
micro-batch, default 2000); ``status_key`` (hash that gets ``read_n`` and
``read_id`` on every commit); ``connect_deadline_s`` (default 300).

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

import logging
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
        self._client = None
        self._recorded_n = -1

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
        # proves everything up to ``start`` is done. commit() alone lags: Spark
        # calls it only when it plans the *next* data batch, so an idle stream
        # would report its last batch as unread forever.
        self._record_progress(start)
        entries = self._redis(
            "read new entries",
            lambda r: r.xrange(self.stream, min="(" + start["id"], count=self.batch_size),
        )
        if not entries and self.block_ms:
            # Nothing new: wait in Redis rather than let Spark poll every 10 ms
            # (about 20% of a core per idle query, measured). A new entry
            # still comes back at once.
            reply = self._redis(
                "wait for new entries",
                lambda r: r.xread(
                    {self.stream: start["id"]}, count=self.batch_size, block=self.block_ms
                ),
            )
            entries = reply[0][1] if reply else []
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

    def _record_progress(self, done: dict) -> None:
        n = int(done["n"])
        if not self.status_key or n <= self._recorded_n:
            return
        mapping = {"read_n": n, "read_id": done["id"]}
        self._redis("record the read offset", lambda r: r.hset(self.status_key, mapping=mapping))
        self._recorded_n = n

    def _redis(self, what: str, call: Any) -> Any:
        """Run ``call(client)``; wait out connection trouble up to the deadline."""
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
                return call(self._client)
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


def _row(entry: tuple) -> Row:
    entry_id, fields = entry
    return entry_id.decode(), fields.get(b"data")
