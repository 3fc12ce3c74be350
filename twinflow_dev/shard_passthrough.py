"""The bare sharded passthrough: a sharded flow's read path on the executors, without the flow.

    python -m twinflow_dev.shard_passthrough --redis-url redis://127.0.0.1:6379/0 \\
        --spark-master spark://127.0.0.1:7077 --prefix pt2 --shards 2 --workdir /tmp/pt2

The floor of ``bench/shards.py``'s sharded flow on the same Spark cluster: one driver with
twinflow's Spark session, the shard source (``runtime/spark/shard_source.py``) over
``<prefix>:s<k>:uplink`` through ``stream.start_shard_stream``, and per micro-batch the
sharded flow's own plumbing (``mapInArrow`` over the frame, the partition's packed rows as
``shard_task.partition_rows`` unpacks them, one pickled result per shard back to the driver by
``toArrow``). What each task does in place of the flow: copy every entry's body to
``<prefix>:s<k>:sink`` and set ``<prefix>:s<k>:processed`` to the batch's last position, in
one pipeline (MULTI/EXEC) per shard, from the executor. ``<prefix>:ready`` is set once the
query's warm-up batch came back.

Under failure: a task that fails is retried by Spark, then fails the query and this process
exits non-zero; a batch run again copies its entries again (a floor, not a flow: nothing here
promises exactly once). SIGTERM stops the query and the process.
"""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import threading
from functools import partial
from typing import Any, Iterator

RESULT_SCHEMA = "result binary"


def stream_keys(prefix: str, k: int) -> tuple[str, str, str]:
    """Shard ``k``'s uplink, sink and processed-mark keys."""
    return f"{prefix}:s{k}:uplink", f"{prefix}:s{k}:sink", f"{prefix}:s{k}:processed"


def copy_partition(redis_url: str, prefix: str, batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body on an executor: each shard's rows copied to its sink, its mark set."""
    import pyarrow as pa

    from twinflow.cluster.shard_task import partition_rows

    client = _client(redis_url)
    for k, rows in partition_rows(batches, packed=True).items():
        copied = 0
        if k >= 0:  # not the warm-up row
            _, sink, processed = stream_keys(prefix, k)
            pipe = client.pipeline(transaction=True)
            for _, data, _ in rows:
                pipe.xadd(sink, {"data": data or b""})
            pipe.set(processed, rows[-1][0])
            pipe.execute()
            copied = len(rows)
        yield pa.RecordBatch.from_pydict({"result": [pickle.dumps((k, copied))]},
                                         schema=pa.schema([("result", pa.binary())]))


_clients: dict[str, Any] = {}


def _client(url: str):
    """One client per executor process (kept between tasks, as a shard's store is)."""
    import redis

    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url)
    return _clients[url]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--spark-master", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--spark-conf", action="append", default=[], help="KEY=VALUE, as twinflow run takes it")
    args = ap.parse_args()

    import redis

    from twinflow.runtime.spark.session import build_session
    from twinflow.runtime.spark.stream import PACK_ENTRIES, start_shard_stream, stop_stream

    conf = dict(item.split("=", 1) for item in args.spark_conf)
    spark = build_session(f"twinflow-{args.prefix}-passthrough", args.spark_master, conf)
    client = redis.Redis.from_url(args.redis_url)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def on_frame(frame, batch_id: int) -> None:
        table = frame.mapInArrow(partial(copy_partition, args.redis_url, args.prefix), RESULT_SCHEMA).toArrow()
        for blob in table.column(0).to_pylist():
            k, _ = pickle.loads(blob)
            if k < 0:
                client.set(f"{args.prefix}:ready", 1)

    query = start_shard_stream(
        spark, redis_url=args.redis_url,
        shards=[{"stream": stream_keys(args.prefix, k)[0]} for k in range(args.shards)],
        checkpoint_dir=os.path.join(args.workdir, "checkpoint"), on_frame=on_frame,
        max_batch_size=20_000, query_name=f"{args.prefix}_passthrough",
        pack=PACK_ENTRIES)  # as a sharded flow's peer reads (shard_reading)
    while not stop.wait(0.5):
        if not query.isActive:
            raise SystemExit(f"the query stopped: {query.exception()}")
    stop_stream(query, 10.0)
    spark.stop()


if __name__ == "__main__":
    main()
