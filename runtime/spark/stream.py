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
  exactly once, including across a clean stop and restart.
- Redis down: the source waits (see ``source``); no batch runs meanwhile.
"""

from __future__ import annotations

import threading
from typing import Callable, List, Optional, Tuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from twinflow.runtime.spark.source import DEFAULT_BATCH_SIZE, SOURCE_NAME

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
    options = {**(source_options or {}), "url": redis_url, "stream": stream}
    options["batch_size"] = str(batch_size)
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
    return writer.start()


def stop_stream(query: StreamingQuery, timeout_s: float) -> bool:
    """Stop ``query``, waiting at most ``timeout_s``; True if it stopped.

    False means the micro-batch thread is still busy (a slow ``on_batch``, or
    the source waiting for Redis); the stop goes on in the background and the
    query ends when that call returns. A batch cut short by the stop is not
    committed and is delivered again on restart.
    """
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
    stopper.join(timeout_s)
    if errors:
        raise errors[0]
    return not query.isActive
