"""Whether Spark's Real-time Mode (``trigger(realTime=...)``, Spark 4.1+) can run a peer's query:
twinflow's Redis-stream source (a Python data source) into ``foreachBatch``, and into
``foreach`` as the one other sink a peer could use. Prints what Spark says for each.

    .venv/bin/python bench/realtime_mode.py

Measured with PySpark 4.3.0 (docs/performance/throughput.md, "What earlier changes did to latency"): both refused.
"""

import tempfile

from twinflow.runtime.spark.session import build_session
from twinflow.runtime.waiting import wait_for
from twinflow.testing.services import LocalServices


class _Writer:  # a ForeachWriter
    def open(self, partition_id, epoch_id):
        return True

    def process(self, row):
        pass

    def close(self, error):
        pass


def main() -> None:
    services = LocalServices.start(base_dir=tempfile.mkdtemp(prefix="twinflow-rtm-"), deadline_s=30, zookeeper=False)
    spark = build_session("twinflow-realtime-mode")
    try:
        df = (spark.readStream.format("twinflow_redis_stream").option("url", services.redis_url)
              .option("stream", "rtm:uplink").load())
        for sink in ("foreachBatch", "foreach"):
            writer = df.writeStream.option("checkpointLocation", tempfile.mkdtemp()).outputMode("update")
            writer = writer.foreachBatch(lambda batch, batch_id: None) if sink == "foreachBatch" else writer.foreach(_Writer())
            try:
                query = writer.trigger(realTime="5 seconds").start()
            except Exception as exc:  # noqa: BLE001 - what Spark says is the result
                print(f"{sink}: refused at start: {exc}")
                continue
            wait_for(lambda: not query.isActive or query.exception() is not None, 30, 0.1)
            print(f"{sink}: {'runs' if query.isActive else 'stopped'}: {query.exception()}")
            query.stop()
    finally:
        spark.stop()
        services.stop()


if __name__ == "__main__":
    main()
