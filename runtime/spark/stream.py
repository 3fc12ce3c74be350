"""Run a Redis Stream through Spark into a Python callback on the driver.

    query = start_stream(spark, redis_url="redis://127.0.0.1:6379/0",
                         stream="flow:uplink:0", checkpoint_dir="/var/lib/tf/ck",
                         on_batch=lambda batch_id, rows: print(batch_id, len(rows)))
    ...
    hold_stream(query, True)       # backpressure: plan no new batch ...
    hold_stream(query, False)      # ... until released
    stop_stream(query, timeout_s=10)

``on_batch(batch_id, rows)`` gets ``[(position, data, size), ...]`` in uplink
order: ``size`` is the length of the entry's ``data`` field (None when it has
none); ``data`` its bytes, or None when there is no such field or the body is
longer than ``max_body_bytes`` and was withheld (then ``size`` still tells
how long it is). A batch holds at most ``batch_size`` entries and at most
``batch_bytes`` bytes of delivered bodies, except that a batch of one entry
may go over ``batch_bytes`` (up to ``max_body_bytes``). A warm-up row (source
option ``warmup``) is ``(WARMUP_POSITION, None, None)``. ``on_batch`` runs in
this Python process (classic PySpark calls foreachBatch back over Py4J), on
Spark's callback thread, one batch at a time, so it may touch in-process
state but should not block long: the next batch waits for it. The rows are
read from Redis here, between the offsets Spark logged for the batch (the
entries Spark would read to run it again), not collected from Spark; a
batch whose offset log cannot be read is collected (``logged_batch.py``;
``batch_reads`` counts both).

``hold_stream(query, True)`` stops the source planning batches (the batch in
flight, if any, still completes) until ``hold_stream(query, False)``;
``hold_state(query)`` tells whether the source has seen the hold and how many
of its reads it held back. Reading resumes at once on release (the held
source checks every 10 ms); entries added meanwhile wait in Redis. A hold
belongs to one query run: a restarted query starts unheld.

Under failure:

- ``on_batch`` raises: the query fails with that error (``awaitTermination``
  and ``query.exception()`` show it) and the batch is not committed.
- Crash or failure after ``on_batch`` returned but before Spark committed the
  batch: on restart with the same ``checkpoint_dir`` the same batch (same
  ``batch_id``, same entries) is delivered again. Delivery is therefore
  at-least-once per batch; make ``on_batch`` idempotent by position or
  batch_id where a repeat matters. Without a crash, each entry is delivered
  exactly once, including across ``stop_stream`` and a restart (it stops
  between batches), but not across a bare ``query.stop()``, which can cut a
  batch short after ``on_batch`` returned.
- Redis down: the source waits (see ``source``); no batch runs meanwhile.
- Held: ``stop_stream`` still stops the query at a batch boundary, within
  about 10 ms of asking plus Spark's own stop. Holding never loses or repeats
  an entry: the source just returns "nothing new" from where it is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Callable, List, Optional, Tuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from twinflow.runtime.spark.logged_batch import LoggedBatches, delivering
from twinflow.runtime.spark.packed_rows import unpack_rows
from twinflow.runtime.spark.reader_gates import write_atomically
from twinflow.runtime.spark.source import RedisStreamReader
from twinflow.runtime.spark.source_options import (
    DEFAULT_BATCH_BYTES, DEFAULT_BATCH_SIZE, DEFAULT_MAX_BODY_BYTES, SOURCE_NAME)

log = logging.getLogger(__name__)

PAUSE_FILE = "pause"
HOLD_FILE = "hold"
PACE_FILE = "pace"
# runId -> directory of that run's pause and hold files; see stop_stream, hold_stream.
_pause_dirs: dict[str, str] = {}
# runId -> how that run's batches are read (see batch_reads).
_logged: dict[str, LoggedBatches] = {}

# Entries per Spark row (source "Packed rows"): Spark's per-row cost is paid per this many.
PACK_ENTRIES = 1000

Rows = List[Tuple[str, Optional[bytes], Optional[int]]]
OnBatch = Callable[[int, Rows], None]


def start_stream(
    spark: SparkSession,
    *,
    redis_url: str,
    stream: str,
    checkpoint_dir: str,
    on_batch: OnBatch,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batch_size: int | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    status_key: str | None = None,
    skip_key: str | None = None,
    query_name: str | None = None,
    source_options: dict | None = None,
) -> StreamingQuery:
    """Start a query feeding ``stream`` to ``on_batch``; returns once started.

    ``spark`` must have the source registered (``build_session`` does it).
    ``batch_size`` bounds a batch's entries under light load, ``max_batch_size``
    (default ``batch_size``) under a backlog (the source's "Admission"), and
    ``batch_bytes`` its delivered body bytes; a body longer than ``max_body_bytes`` is withheld (``data``
    None, ``size`` set). ``source_options`` passes further source options
    (``connect_deadline_s``, ``block_ms``, ``warmup``) through. ``skip_key``, the flow's
    processed mark: every read starts after it when it is further (the source's "Skipping
    what is processed").
    """
    # The source watches these files so stop_stream can pause it between batches
    # and hold_stream can hold it; they live on the driver host, where Spark
    # runs the source's read().
    pause_dir = tempfile.mkdtemp(prefix="twinflow-stream-")
    options = {**(source_options or {}), "url": redis_url, "stream": stream}
    options["batch_size"] = str(batch_size)
    options["max_batch_size"] = str(max_batch_size or batch_size)
    options["batch_bytes"] = str(batch_bytes)
    options["max_body_bytes"] = str(max_body_bytes)
    options["pack"] = str(PACK_ENTRIES)  # deliver() takes the batch whole: ship it packed
    options["pause_file"] = os.path.join(pause_dir, PAUSE_FILE)
    options["hold_file"] = os.path.join(pause_dir, HOLD_FILE)
    options["pace_file"] = os.path.join(pause_dir, PACE_FILE)
    if status_key:
        options["status_key"] = status_key
    if skip_key:
        options["skip_key"] = skip_key

    # The driver reads each batch from Redis by the offsets Spark logged for it: no Spark job
    # (logged_batch.py); the DataFrame only when that cannot be done.
    logged = LoggedBatches(checkpoint_dir, RedisStreamReader({k: v for k, v in options.items() if k != "pack"}))

    def deliver(batch_df: DataFrame, batch_id: int) -> None:
        began = time.perf_counter()
        rows = logged.rows(batch_id)
        if rows is None:
            # One partition (SimpleDataSourceStreamReader), so the batch keeps uplink order.
            # Through Arrow, column by column: no Row object per entry (measured faster).
            table = batch_df.toArrow()
            positions, bodies, sizes = (table.column(i).to_pylist() for i in range(3))
            rows = unpack_rows(positions, bodies, sizes)
        delivering.read_s = time.perf_counter() - began
        on_batch(batch_id, rows)

    query = _start_query(spark, SOURCE_NAME, options, deliver, checkpoint_dir, query_name, pause_dir)
    _logged[query.runId] = logged
    return query


def batch_reads(query: StreamingQuery) -> Optional[dict]:
    """How ``query``'s batches reached ``on_batch`` so far: ``{"by_offsets": n, "collected": m}``
    (read from Redis by the driver, or collected from Spark; ``logged_batch.py``), or None
    for a query not started by :func:`start_stream`."""
    logged = _logged.get(query.runId)
    return None if logged is None else dict(logged.counts)


def start_shard_stream(
    spark: SparkSession,
    *,
    redis_url: str,
    shards: list[dict],
    checkpoint_dir: str,
    on_frame: Callable[[DataFrame, int], None],
    max_batch_size: int,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    query_name: str | None = None,
    warmup: bool = True,
    pack: int = 0,
) -> StreamingQuery:
    """Start a query over a flow's uplink shards (``shard_source``); ``on_frame(df, batch_id)``
    gets each micro-batch as a DataFrame (shard, position, data, size), one partition per
    shard with new entries, to run work on the executors that read them. ``shards``: per
    shard ``stream`` and optionally ``status_key``, ``start_id``, ``start_n``. ``pack``:
    entries per Spark row (the source's "Packed rows"; 0, one row per entry), for a caller
    that unpacks each partition whole (``packed_rows.unpack_rows``).
    ``stop_stream`` stops it; ``hold_shards`` holds some of its shards."""
    from twinflow.runtime.spark.shard_source import SHARD_SOURCE_NAME

    pause_dir = tempfile.mkdtemp(prefix="twinflow-shards-")
    options = {
        "url": redis_url, "shards": json.dumps(shards), "max_batch_size": str(max_batch_size),
        "batch_bytes": str(batch_bytes), "max_body_bytes": str(max_body_bytes),
        "pause_file": os.path.join(pause_dir, PAUSE_FILE), "hold_file": os.path.join(pause_dir, HOLD_FILE),
        "warmup": "1" if warmup else "0", "pack": str(pack),
    }
    return _start_query(spark, SHARD_SOURCE_NAME, options, on_frame, checkpoint_dir, query_name, pause_dir)


def _start_query(spark: SparkSession, source: str, options: dict, deliver, checkpoint_dir: str,
                 query_name: str | None, pause_dir: str) -> StreamingQuery:
    reader = spark.readStream.format(source)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    writer = (
        reader.load()
        .writeStream.foreachBatch(deliver)
        .trigger(processingTime="0 seconds")
        .option("checkpointLocation", checkpoint_dir)
    )
    if query_name:
        writer = writer.queryName(query_name)
    try:
        query = writer.start()
    except BaseException:
        shutil.rmtree(pause_dir, ignore_errors=True)
        raise
    _pause_dirs[query.runId] = pause_dir
    return query


def stop_stream(query: StreamingQuery, timeout_s: float) -> bool:
    """Stop ``query`` between batches, waiting at most ``timeout_s``; True if it stopped.

    First the source is paused and the batch in flight (if any) allowed to
    finish and commit, so a restart delivers nothing twice. If that does not
    happen in time (a slow ``on_batch``), the query is interrupted and the
    batch it was in is delivered again on restart. False means even the
    interrupt did not land in time; the query ends when its current call
    returns.
    """
    deadline = time.monotonic() + timeout_s
    pause_dir = _pause_dirs.pop(query.runId, None)
    _logged.pop(query.runId, None)
    if pause_dir and query.isActive:
        pause = os.path.join(pause_dir, PAUSE_FILE)
        os.makedirs(pause_dir, exist_ok=True)  # a /tmp cleaner may have removed it
        open(pause, "w").close()
        while not os.path.exists(pause + ".ack") and query.isActive:
            if time.monotonic() >= deadline:
                log.warning(
                    "query %s did not reach a batch boundary in %.1fs; interrupting it, "
                    "its current batch will be delivered again on restart",
                    query.name or query.id, timeout_s,
                )
                break
            time.sleep(0.01)

    errors: list[BaseException] = []

    def stop() -> None:
        try:
            query.stop()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)

    # Spark's own stop waits forever by default (spark.sql.streaming.stopTimeout
    # = 0); a thread bounds the wait without changing a session-wide setting.
    stopper = threading.Thread(target=stop, name=f"stop-{query.name or query.id}", daemon=True)
    stopper.start()
    # Even with the deadline spent, give an idle query a moment to take the stop.
    stopper.join(max(deadline - time.monotonic(), 0.5))
    if errors:
        raise errors[0]
    stopped = not query.isActive
    if pause_dir and stopped:
        shutil.rmtree(pause_dir, ignore_errors=True)
    return stopped


def hold_stream(query: StreamingQuery, on: bool) -> bool:
    """Hold (``on``) or release ``query``'s source; False if the query is not ours or stopped.

    While held the source plans no new batch; a batch already planned still
    runs to the end. Placing a hold that is already in place changes nothing;
    releasing lets the source read again at once. Watch
    ``hold_state`` to learn when the source has seen the hold.
    """
    pause_dir = _pause_dirs.get(query.runId)
    if pause_dir is None:
        return False
    hold = os.path.join(pause_dir, HOLD_FILE)
    if on:
        if not os.path.exists(hold):
            # A fresh token per hold, echoed in the source's acknowledgement, so
            # an acknowledgement of an earlier hold is never taken for this one.
            _write_control(query, HOLD_FILE, uuid.uuid4().hex)
    else:
        for path in (hold, hold + ".ack"):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    return True


def hold_shards(query: StreamingQuery, held: set[int]) -> bool:
    """Hold the shards in ``held`` of a ``start_shard_stream`` query (the others read on);
    an empty set releases all. False if the query is not ours."""
    return _write_control(query, HOLD_FILE, json.dumps(sorted(held)))


def shard_hold_state(query: StreamingQuery) -> Optional[set[int]]:
    """The shards a ``start_shard_stream`` query's planner holds from now on (it has seen the
    hold file), or None before it has acknowledged any hold."""
    pause_dir = _pause_dirs.get(query.runId)
    if pause_dir is None:
        return None
    try:
        with open(os.path.join(pause_dir, HOLD_FILE) + ".ack") as acked:
            return set(json.load(acked))
    except (FileNotFoundError, ValueError):
        return None


def pace_stream(query: StreamingQuery, interval_ms: int, behind_ms: int = 0) -> bool:
    """Let ``query``'s source plan a batch at most every ``interval_ms`` (0: as fast as it
    can) and read no entry newer than ``behind_ms`` (0: every one); False if the query is not
    ours. Takes effect on the source's next read."""
    return _write_control(query, PACE_FILE, f"{int(interval_ms)} {int(behind_ms)}")


def _write_control(query: StreamingQuery, name: str, text: str) -> bool:
    """Replace the control file ``name`` the source of ``query`` watches (never seen half
    written); False if the query is not ours."""
    pause_dir = _pause_dirs.get(query.runId)
    if pause_dir is None:
        return False
    os.makedirs(pause_dir, exist_ok=True)  # a /tmp cleaner may have removed it
    write_atomically(os.path.join(pause_dir, name), text)
    return True


def hold_state(query: StreamingQuery) -> Optional[dict]:
    """The source's acknowledgement of the hold now in place, or None.

    ``{"held_reads": n, "offset": {...}}``: the source has held back ``n``
    reads since this hold was placed, each returning "nothing new" from
    ``offset`` (every batch before it committed). None while not held, or
    held but not yet seen by the source.
    """
    pause_dir = _pause_dirs.get(query.runId)
    if pause_dir is None:
        return None
    hold = os.path.join(pause_dir, HOLD_FILE)
    try:
        with open(hold) as held:
            token = held.read()
        with open(hold + ".ack") as acked:
            ack = json.load(acked)
    except (FileNotFoundError, ValueError):
        return None
    if ack.get("hold") != token:
        return None
    return {"held_reads": ack["held_reads"], "offset": ack["offset"]}
