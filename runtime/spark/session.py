"""A SparkSession tuned for a small, latency-bound streaming driver.

    spark = build_session("twinflow-node-a")                 # local[1]
    spark = build_session("node-a", master="spark://h:7077") # real cluster

The settings come from measurements on the project's 2-core machine (see
DESIGN.md, "Facts measured on this machine"). Start-up takes seconds (the JVM),
so build one session per process and reuse it.

Under failure: JVM settings (driver memory, Java options) only take effect if
this call starts the JVM; if a session already exists in the process it is
returned with these runtime settings applied but its JVM unchanged. A JVM
that cannot start raises from here; nothing is retried.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from twinflow.runtime.spark.source import register_source

BASE_CONF = {
    # Less than 512m fails at start-up on this machine.
    "spark.driver.memory": "512m",
    # SerialGC + C1 only: measured about 2 s faster start, fine for a small heap.
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Batches are small; one shuffle partition avoids scheduling idle tasks.
    "spark.sql.shuffle.partitions": "1",
    # Without Hadoop's native library the default manager forks shell commands
    # for every checkpoint file (about 100 ms per micro-batch).
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}


def build_session(
    app_name: str, master: str = "local[1]", extra_conf: dict | None = None
) -> SparkSession:
    """Start (or join) the process's SparkSession with the source registered.

    ``master`` is any Spark master URL; ``extra_conf`` overrides BASE_CONF.
    """
    # Workers must run this interpreter, or they cannot import redis/twinflow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**BASE_CONF, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_source(spark)
    return spark
