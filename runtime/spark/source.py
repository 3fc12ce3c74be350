"""Redis Stream as a Spark streaming source (PySpark Python Data Source API).

Register once per session, then read with the format name::

    register_source(spark)              # build_session() does this
    df = (spark.readStream.format("twinflow_redis_stream")
          .option("url", "redis://127.0.0.1:6379/0")
          .option("stream", "flow:uplink:0")
          .load())                      # position STRING, data BINARY, size LONG

One row per stream entry: ``position`` is the entry ID; ``size`` the byte
length of the entry's ``data`` field (null when it has none); ``data`` that
field's bytes, or null when there is none or its body was withheld because
``size`` exceeds ``max_body_bytes``. A withheld body stays in Redis: the
caller learns the entry and its true size, never its bytes.

Packed rows (option ``pack``, N > 0): each row carries up to N consecutive
entries (and about ``PACK_BYTES`` of bodies) instead of one: ``position`` is
its last entry's ID, ``size`` how many entries it holds, ``data`` those
entries' ``(position, data, size)`` triples as above, pickled;
:func:`unpack_rows` (``packed_rows.py``) turns a batch back into one triple per entry. Spark's
per-row work (the rows cross from this reader's Python worker into the JVM
and back out to the driver) costs about 14 µs of JVM CPU per row here
(measured: docs/performance.md, "Per-peer costs"), so a reader whose caller takes the batch whole
(``stream.start_stream`` does) pays it per N entries. The pickle travels only
from this reader to its own query's driver, the path Spark itself pickles on.

Options: ``url``, ``stream`` (required); ``batch_size`` (max entries per
micro-batch under light load, default 2000); ``max_batch_size`` (default:
``batch_size``; see "Admission" below); ``batch_bytes`` (max body bytes per micro-batch,
default 64 MiB; a batch holds at least one entry, so a single entry may go
over it, up to ``max_body_bytes``; withheld bodies count 0); ``max_body_bytes``
(longest body delivered, default 1 MiB); ``status_key`` (a hash, one per
reader, that gets ``read_n`` and ``read_id`` once a batch is processed, so
``XINFO STREAM``'s entries-added minus ``read_n`` is the exact backlog);
``connect_deadline_s`` (default 300); ``block_ms`` (how long one read waits
in Redis for new entries when there are none, default 100; 0 = poll);
``pack`` (entries per row, default 0: one row per entry; see above);
``pause_file`` (set by ``stream.start_stream``: once the file exists, no new
batch is planned and ``<pause_file>.ack`` says so); ``hold_file`` (set by
``stream.start_stream``: while the file exists no new batch is planned, see
"Hold" below); ``warmup`` ("1": the first read of each query run returns one
synthetic row ``(WARMUP_POSITION, None, None)``, so the query pays its cold
first batch, 5-12 s measured, at start rather than on the first real
message, and the caller learns when it is ready).

Each batch is read with one Lua script call (``READ_BATCH``), which pages
through XRANGE inside Redis and returns only what fits both bounds, so
neither a long backlog nor large entries are ever fetched whole: the reply
holds at most ``max(batch_bytes, max_body_bytes)`` bytes of bodies. When
nothing is new, the read waits in Redis (XREAD BLOCK, COUNT 1) but reads
only the first line of that reply, dropping the connection if an entry came,
and then reads through the script; the new entry itself is never fetched by
the wait. One script call keeps Redis busy for its run (about a batch's worth
of XRANGE work), like the single XRANGE it replaces.

Offsets are ``{"id": <last entry id read>, "n": <entries read so far>,
"max_body": <max_body_bytes of that batch>}`` and Spark checkpoints them, so a
restarted query resumes right after the last entry of the last planned
batch. The stream is never trimmed or acknowledged here: entries stay for
other readers and for replay.

Admission: a batch takes what is there, up to a cap. The cap is
``batch_size``; once a batch comes back with at least ``batch_size``
entries (a backlog) the next may take up to ``max_batch_size``, and once
one comes back with fewer the cap is ``batch_size`` again. So under a
burst each micro-batch's fixed cost (planning, two checkpoint files, the
``foreachBatch`` call: about 30 ms here) is paid for many more entries, and under light
load a batch is whatever arrived since the last one. (The cap used to
double per full batch: a burst of 50,000 then took 6 batches instead of 4,
measured 13,416 -> 14,278 msg/s for the pair.) A batch is
never larger than ``max_batch_size`` entries or ``batch_bytes`` of bodies.

Hold (backpressure) and pace (``hold_file``, ``pace_file``): see ``reader_gates.py``.

Skipping what is processed (option ``skip_key``, the flow's processed mark):
a read to the end starts after the mark when the mark is further than where
the reader stands. Every entry up to the mark was processed by a master
whose fenced COMMIT moved it, so no role needs it: a worker would only let
it pass through its bake, a master's graph would drop it. The script counts
the entries it skips (their IDs never leave Redis), so ``n`` and the
backlog figure stay exact; a batch's end offset says where its entries
began (``from``) and how many it skipped, so a replay reads the same
entries. A read that skips and finds nothing after the mark moves the
offset only once a second (``SKIP_BATCH_EVERY_S``) or once it skipped a
whole ``max_batch_size``: a batch costs Spark's fixed work, and a worker
reading behind would otherwise run one per read for no entry. Such a batch
has one row ``(mark, None, SKIPPED_SIZE)``: no entry, but the position the
batch handled up to, which the caller must record as handled (a
promotion's catch-up covers what the reader passed). Counting pages
through the entries inside Redis, so one read counts at most
``SKIP_PER_READ`` (Redis serves no one else meanwhile, and a worker
catching up after a few bursts would page through all of them in one
call), and
the reads from one offset go on from where the last one counted to, while
the mark is still there or further (a Redis failover can take it back),
instead of counting again (a worker reading behind at 2,000 msg/s
recounted up to a second's entries every read: 3-7 ms of Redis each, the
master's COMMITs and reads waiting behind them).

Read behind (the pace file's second number, ``stream.pace_stream``): a read
takes no entry newer than that many milliseconds before Redis's clock. A
worker reading so stays behind its master under load, so that most of what
it reads is already processed and skipped instead of baked; it plans at
most every 100 ms, since waiting in Redis for a new entry would return at
once.

Under failure:

- Redis unreachable, timing out or still loading: every call waits and
  retries (backoff up to 1 s), logging what it waits for, and only raises
  after ``connect_deadline_s`` of continuous failure. A read never turns an
  outage into "no data" without saying so. A lost script cache (Redis
  restarted) is reloaded transparently.
- Replay after a crash: ``readBetweenOffsets`` re-reads by entry ID through
  the same script, up to the batch's last ID and with the ``max_body`` the
  batch was planned with, so the replayed batch holds the same entries, in
  the same order, with the same bodies withheld, even if the reader's options
  changed across the restart; provided nobody trimmed entries from the stream
  meanwhile (a shortfall is logged). A replayed warm-up batch yields its
  warm-up row again.
- An entry without a ``data`` field is delivered with ``data`` and ``size``
  None, never dropped; an entry whose body is withheld is delivered with
  ``data`` None and its ``size``; the flow routes both to a failure outlink.

Where the code runs (PySpark 4.3, classic): ``read``/``commit`` run in a
long-lived Python worker that the driver JVM forks per query (not the
driver's own Python process), so the pause and hold files live on the driver
host; ``readBetweenOffsets`` runs only on replay, in an executor's Python
worker, so executors must reach Redis too. Spark's wrapper keeps the rows of
the last committed and the current batch in that worker, so it holds up to
about two batches' bodies. Needs Redis 6.2+ for exclusive XRANGE bounds.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Iterator, List, Optional, Tuple

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from twinflow.runtime.store.scripts import READ_BATCH, counted_from, read_batch_args, read_batch_result
from twinflow.runtime.store.redis_caller import RedisCaller
from twinflow.runtime.store.redis_slot import client_from_url
from twinflow.runtime.positions import WARMUP_POSITION, skipped_row
from twinflow.runtime.spark.packed_rows import Row, pack_rows
from twinflow.runtime.spark.reader_gates import ReaderGates, _Held, _Paused
from twinflow.runtime.spark.redis_wait import _wait_for_entry
from twinflow.runtime.spark.source_options import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONNECT_DEADLINE_S,
    DEFAULT_BLOCK_MS,
    DEFAULT_MAX_BODY_BYTES,
    SOURCE_NAME,
    _int_option,
)
from twinflow.runtime.waiting import Backoff

log = logging.getLogger(__name__)

_READER_WORKER = "pyspark.sql.streaming.python_streaming_source_runner"


class _NoPandas:
    """An import finder that refuses pandas (see ``_no_pandas_in_the_reader_worker``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"no {name} in twinflow's stream reader worker", name=name)
        return None


def _no_pandas_in_the_reader_worker() -> None:
    """In the Python worker that runs this reader (PySpark's streaming source runner), and only
    there, make pandas unimportable.

    The worker hands each batch to the JVM as Arrow record batches; pyarrow, building one from
    Python lists, imports pandas to ask whether a column is a pandas object, and keeps it: the
    worker took 156 MiB RSS idle with pandas, 114 without (bench/node_memory.py). Without pandas
    pyarrow answers "no" and builds the same batches. This module is imported there when the
    worker unpickles the data source, before its first batch. Other workers and the driver are
    untouched.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) == _READER_WORKER and "pandas" not in sys.modules:
        if not any(isinstance(f, _NoPandas) for f in sys.meta_path):
            sys.meta_path.insert(0, _NoPandas())


_no_pandas_in_the_reader_worker()

SCHEMA = StructType(
    [
        StructField("position", StringType(), False),
        StructField("data", BinaryType(), True),
        StructField("size", LongType(), True),
    ]
)
_MAX_BACKOFF_S = 1.0
SKIP_BATCH_EVERY_S = 1.0  # a batch of skipped entries alone at most this often (see "Skipping")
SKIP_PER_READ = 4096  # processed entries one read counts at most (see "Skipping")
# Entries one script call reads when a planned batch is read again by its offsets (the driver
# reads every batch so, logged_batch.py). A batch of 5,000-10,000 entries read in one call held
# Redis 18-311 ms under a burst, the master's COMMITs waiting behind it (Redis's slow log).
REREAD_PAGE = 2000
_LOG_EVERY_S = 10.0


def register_source(spark: Any) -> None:
    """Make ``format("twinflow_redis_stream")`` available in ``spark``."""
    spark.dataSource.register(RedisStreamDataSource)


def _where(url: str) -> str:
    # For logs: host, port and db only; a URL may carry a password.
    # Hosts, ports and db only (a Sentinel URL names several hosts); a URL may carry a password.
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path.partition('?')[0]}"


class RedisStreamDataSource(DataSource):
    """Reads one Redis Stream in entry-ID order; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def simpleStreamReader(self, schema: StructType) -> "RedisStreamReader":
        return RedisStreamReader(dict(self.options))


class RedisStreamReader(ReaderGates, SimpleDataSourceStreamReader):
    """One reader per query; keeps one Redis client, created on first use."""

    def __init__(self, options: dict) -> None:
        for required in ("url", "stream"):
            if not options.get(required):
                raise ValueError(f"{SOURCE_NAME}: option {required!r} is required")
        self.url = options["url"]
        self.stream = options["stream"]
        self.batch_size = _int_option(options, "batch_size", DEFAULT_BATCH_SIZE, 1)
        self.max_batch_size = max(self.batch_size, _int_option(options, "max_batch_size", self.batch_size, 1))
        self._take = self.batch_size  # this read's cap (see "Admission")
        self.batch_bytes = _int_option(options, "batch_bytes", DEFAULT_BATCH_BYTES, 1)
        self.pack = _int_option(options, "pack", 0, 0)
        self.max_body_bytes = _int_option(options, "max_body_bytes", DEFAULT_MAX_BODY_BYTES, 0)
        self.status_key = options.get("status_key") or None
        self.skip_key = options.get("skip_key") or None
        self.connect_deadline_s = float(
            options.get("connect_deadline_s") or DEFAULT_CONNECT_DEADLINE_S
        )
        self.block_ms = int(options.get("block_ms") or DEFAULT_BLOCK_MS)
        self.pause_file = options.get("pause_file") or None
        self.hold_file = options.get("hold_file") or None
        self.pace_file = options.get("pace_file") or None
        self._last_plan = float("-inf")  # monotonic time the last batch with entries was planned
        self._last_batch = float("-inf")  # ... the last batch of any kind
        self.start_id = options.get("start_id") or "0-0"
        self.start_n = int(options.get("start_n") or 0)
        self._warmup_due = options.get("warmup") == "1"
        self._caller: Optional[RedisCaller] = None  # made on the first call (see _redis)
        self._script = None
        self._recorded_n = -1
        self._reading_from: dict = {}
        self._pause_acked = False
        self._hold_token: Optional[str] = None
        self._held_reads = 0
        # (offset id, counted to, how many): processed entries the reads from that offset
        # counted without making a batch (see "Skipping"); the next read goes on from there.
        self._counted: Optional[Tuple[str, str, int]] = None

    def __getstate__(self) -> dict:
        # Spark pickles readers to ship them to workers; sockets don't travel.
        state = self.__dict__.copy()
        state["_caller"] = None
        state["_script"] = None
        return state

    def initialOffset(self) -> dict:
        # A new checkpoint starts where the caller chose (``start_id``: read
        # after it; ``start_n``: entries up to it, for the backlog figure).
        return {"id": self.start_id, "n": self.start_n}

    def read(self, start: dict) -> Tuple[Iterator[Row], dict]:
        # Spark runs one batch at a time and asks for the next only after the
        # previous one is processed and logged as committed, so reaching here
        # proves everything up to ``start`` is done.
        self._reading_from = start
        try:
            # Progress is recorded here, not only in commit(): Spark calls
            # commit() only when it plans the *next* data batch, so an idle or
            # stopped stream would show its last batch unread. On the way to a
            # read it travels in the read's own script call (no round trip of
            # its own); a paused, held or warm-up read records it by itself.
            try:
                self._check_pause()
                self._wait_out_hold(start)
                self._wait_out_pace()
            except (_Paused, _Held):
                self._record_progress(start, pausable=True)
                raise
            if self._warmup_due:
                # Only a changed offset makes Spark run a batch; the token changes
                # nothing else (same id, same n) and is dropped by the next batch.
                self._record_progress(start, pausable=True)
                self._warmup_due = False
                return iter([(WARMUP_POSITION, None, None)]), {
                    **start, "warmup": os.urandom(4).hex()
                }
            behind_ms = self._pace_now()[1]
            rows, skipped, skipped_to = self._read_new(start, behind_ms, progress=start)
            if not rows and not skipped and self.block_ms and not behind_ms:
                # Nothing new: wait in Redis rather than let Spark poll every
                # 10 ms (about 20% of a core per idle query, measured). A new
                # entry still comes back at once. (A read behind finds entries
                # older only as time passes: its pace spaces its reads.)
                came = self._redis(
                    "wait for new entries",
                    lambda r: _wait_for_entry(r, self.stream, start["id"], self.block_ms),
                    pausable=True,
                )
                if came:
                    rows, skipped, skipped_to = self._read_new(start, behind_ms)
        except (_Paused, _Held):
            return iter(()), start
        # A backlog while a batch holds at least batch_size (not only while batches come back
        # full): a burst still arriving fills batches short of the grown cap, and dropping
        # back to batch_size then cost the master one more Spark cycle per burst (measured).
        self._take = self.max_batch_size if len(rows) >= self.batch_size else self.batch_size
        if rows or behind_ms:
            self._last_plan = time.monotonic()
        if not rows and not skipped:
            return iter(()), start
        if not rows and skipped < self.max_batch_size and time.monotonic() - self._last_batch < SKIP_BATCH_EVERY_S:
            # Only processed entries: not worth a batch of its own (Spark's fixed cost per batch)
            # each read; the next read from ``start`` goes on counting after them, and a batch
            # now and then.
            self._counted = (start["id"], skipped_to, skipped)
            return iter(()), start
        self._last_batch = time.monotonic()
        self._counted = None
        # Skipped entries count as read (read_n stays exact); "from" is where the batch's
        # entries begin, so that a replay reads the same ones (readBetweenOffsets).
        end = {"id": rows[-1][0] if rows else skipped_to, "n": int(start["n"]) + skipped + len(rows),
               "max_body": self.max_body_bytes}
        if not rows:  # the caller learns how far it handled the uplink all the same
            rows = [skipped_row(skipped_to)]
        if skipped:
            end["from"], end["skipped"] = skipped_to, skipped
        # A list iterator, not a generator: Spark's wrapper copy.copy()s it.
        return iter(self._rows(rows)), end

    def _read_new(self, start: dict, behind_ms: int, progress: Optional[dict] = None):
        """Entries after ``start`` (after the processed mark when it is further, with
        ``skip_key``), no newer than ``behind_ms``; returns (rows, skipped, skipped_to). The
        processed entries a read from ``start`` counted already are not counted again."""
        counted = counted_from(self._counted, start["id"])
        return self._read_result("read new entries", start["id"], "+", self.max_body_bytes, progress=progress,
                                 count=self._take, behind_ms=behind_ms, counted=counted)

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[Row]:
        if end.get("warmup") and end.get("warmup") != start.get("warmup"):
            return iter([(WARMUP_POSITION, None, None)])
        # The batch's own withholding limit, so the replay matches it even if the
        # option changed across a restart (offsets before it lack the key).
        max_body = int(end.get("max_body", self.max_body_bytes))
        if end.get("from") == end["id"]:  # a batch of skipped entries alone: its marker row again
            return iter(self._rows([skipped_row(end["id"])]))
        rows: List[Row] = []
        after = end.get("from", start["id"])  # a batch that skipped processed entries began there
        while after != end["id"]:
            # Pages of REREAD_PAGE entries, each a script call of its own: Redis runs one script
            # at a time, so a master's COMMIT waits for at most one page, not a whole batch.
            more = self._read_rows("re-read a planned batch", after, end["id"], max_body, count=REREAD_PAGE)
            if not more:
                break
            rows.extend(more)
            after = more[-1][0]
        expected = int(end["n"]) - int(start["n"]) - int(end.get("skipped", 0))  # skipped: in n, not the batch
        if len(rows) != expected:
            log.warning(
                "%s: replay of %s..%s found %d entries, the batch had %d (stream trimmed?)",
                self.stream, start["id"], end["id"], len(rows), expected,
            )
        return iter(self._rows(rows))

    def _rows(self, rows: List[Row]) -> List[Row]:
        """A batch's rows as Spark gets them: packed when the ``pack`` option asks."""
        return pack_rows(rows, self.pack) if self.pack else rows

    def commit(self, end: dict) -> None:
        self._record_progress(end)

    def _read_rows(self, what: str, after: str, last: str, max_body: int,
                   progress: Optional[dict] = None, count: Optional[int] = None) -> List[Row]:
        """Entries after ``after`` up to ``last`` ("+": no end), at most ``count`` (default
        ``max_batch_size``) and ``batch_bytes``; records ``progress`` (an offset processed) in
        the same script call when it is new."""
        return self._read_result(what, after, last, max_body, progress, count)[0]

    def _read_result(self, what: str, after: str, last: str, max_body: int, progress: Optional[dict] = None,
                     count: Optional[int] = None, behind_ms: int = 0,
                     counted: Optional[Tuple[str, int]] = None) -> Tuple[List[Row], int, Optional[str]]:
        """As :meth:`_read_rows`, reading to the end (``last`` "+") after the processed mark
        when ``skip_key`` names one that is further, and no entry newer than ``behind_ms``;
        returns (rows, entries skipped, the position read after in their stead)."""
        keys, record = [self.stream], None
        if progress is not None and self.status_key and int(progress["n"]) > self._recorded_n:
            keys, record = [self.stream, self.status_key], (int(progress["n"]), progress["id"])
        skip = bool(self.skip_key) and last == "+"
        if skip:
            keys = keys + [self.skip_key]
        args = read_batch_args(after, last, count or self.max_batch_size, self.batch_bytes, max_body, record,
                               skip_processed=SKIP_PER_READ if skip else False,
                               behind_ms=behind_ms if last == "+" else 0, counted=counted if skip else None)
        reply = self._redis(
            what, lambda r: self._script(keys=keys, args=args, client=r),
            pausable=last == "+",
        )
        if record:
            self._recorded_n = record[0]
        return read_batch_result(reply)

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

    def _redis(self, what: str, call: Any, pausable: bool = False) -> Any:
        """Run ``call(client)``; wait out connection trouble up to the deadline.

        ``pausable`` calls give up waiting (raise _Paused) once a pause is asked.
        """
        began = time.monotonic()
        waiting = {"next_log": began, "logged": False}

        def before_pause(exc: BaseException, waited: float, pause: float) -> None:
            now = time.monotonic()
            if now >= waiting["next_log"]:
                log.warning(
                    "%s: waiting for Redis at %s to %s on stream %r (%.0fs so far, giving up after %.0fs): %s",
                    SOURCE_NAME, _where(self.url), what, self.stream, waited, self.connect_deadline_s, exc,
                )
                waiting.update(next_log=now + _LOG_EVERY_S, logged=True)
            if pausable:
                self._check_pause()

        def give_up(exc: BaseException, waited: float) -> BaseException:
            return RuntimeError(f"{SOURCE_NAME}: gave up after {waited:.0f}s waiting for Redis at "
                                f"{_where(self.url)} to {what} on stream {self.stream!r}: {exc}")

        # Connection trouble, MOVED, and the replies a Redis gives while it cannot serve for now
        # (CLUSTERDOWN during a cluster failover, TRYAGAIN, READONLY, LOADING...): the one policy
        # of store/redis_caller.py, which also follows the uplink's primary.
        if self._caller is None:
            self._caller = RedisCaller(self._connect, on_client=self._registered, backoff=Backoff(max_s=_MAX_BACKOFF_S))
        result = self._caller.call(call, deadline_s=self.connect_deadline_s, give_up=give_up, on_retry=before_pause)
        if waiting["logged"]:
            log.warning("%s: Redis at %s answers again after %.1fs", SOURCE_NAME, _where(self.url),
                        time.monotonic() - began)
        return result

    def _connect(self) -> Any:
        # On a Redis Cluster the client is on the primary that owns the uplink's slot (see
        # store/redis_slot.py), which asks that node, so connecting is part of the waiting too.
        return client_from_url(self.url, socket_timeout=10, socket_connect_timeout=2, decode_responses=False,
                               slot_key=self.stream)

    def _registered(self, client: Any) -> None:
        self._script = client.register_script(READ_BATCH)

