"""Run a Redis Stream through Spark into a Python callback on the driver.

    query = start_stream(spark, redis_url="redis://127.0.0.1:6379/0",
                         stream="flow:uplink:0", checkpoint_dir="/var/lib/tf/ck",
                         on_batch=lambda batch_id, rows: print(batch_id, len(rows)))
    ...
    stop_stream(query, timeout_s=10)

``on_batch(batch_id, rows)`` gets ``[(position, data), ...]`` in uplink
order, ``data`` being bytes or None. It runs in this Python process (classic
PySpark calls foreachBatch back over Py4J), on Spark's callback thread, one
batch at a time, so it may touch in-process state but should not block long:
the next batch waits for it.

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
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Callable, List, Optional, Tuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from twinflow.runtime.spark.source import DEFAULT_BATCH_SIZE, SOURCE_NAME

log = logging.getLogger(__name__)

PAUSE_FILE = "pause"
# runId -> directory of that run's pause file; see stop_stream.
_pause_dirs: dict[str, str] = {}

Rows = List[Tuple[str, Optional[bytes]]]
OnBatch = Callable[[int, Rows], None]


def start_stream(
    spark: SparkSession,
    *,
    redis_url: str,
    stream: str,
    checkpoint_dir: str,
    on_batch: OnBatch,
    batch_size: int = DEFAULT_BATCH_SIZE,
    status_key: str | None = None,
    query_name: str | None = None,
    source_options: dict | None = None,
) -> StreamingQuery:
    """Start a query feeding ``stream`` to ``on_batch``; returns once started.

    ``spark`` must have the source registered (``build_session`` does it).
    ``source_options`` passes further source options (``connect_deadline_s``,
    ``block_ms``) through.
    """
    # The source watches this file so stop_stream can pause it between batches;
    # it lives on the driver host, where Spark runs the source's read().
    pause_dir = tempfile.mkdtemp(prefix="twinflow-stream-")
    options = {**(source_options or {}), "url": redis_url, "stream": stream}
    options["batch_size"] = str(batch_size)
    options["pause_file"] = os.path.join(pause_dir, PAUSE_FILE)
    if status_key:
        options["status_key"] = status_key
    reader = spark.readStream.format(SOURCE_NAME)
    for key, value in options.items():
        reader = reader.option(key, str(value))

    def deliver(batch_df: DataFrame, batch_id: int) -> None:
        # One partition (SimpleDataSourceStreamReader), so collect keeps uplink order.
        rows = batch_df.collect()
        on_batch(batch_id, [(r[0], None if r[1] is None else bytes(r[1])) for r in rows])

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
