"""A SparkSession tuned for a small, latency-bound streaming driver.

    spark = build_session("twinflow-peer-a")                 # local[1]
    spark = build_session("peer-a", master="spark://h:7077") # real cluster

The settings come from measurements on the project's 2-core machine (see
DESIGN.md, "Facts measured on this machine"). Start-up takes seconds (the JVM),
so build one session per process and reuse it.

Faster start (opt-in): a JVM class-data-sharing archive (about 160 MB) of
the classes a streaming driver loads roughly halves the session start
(measured on the loaded 2-core machine: 9-20 s -> 6-7.5 s, and the first
batch of a query 2-5 s sooner). Build it once per machine and PySpark/JDK
version (about 45 s) and point ``TWINFLOW_SPARK_CDS`` at it::

    python -m twinflow.runtime.spark.session --build-cds /var/cache/twinflow/spark.jsa
    export TWINFLOW_SPARK_CDS=/var/cache/twinflow/spark.jsa

The archive only ever appears complete (written aside, renamed when the
dumping JVM has exited): the JVM crashes on a truncated archive, but merely
warns and starts without one that is stale (other PySpark or JDK) or unreadable.

Checkpoint files without a forked ``chmod`` (opt-in, ``local_fs.py``): a local driver takes
the file system of ``TWINFLOW_SPARK_JAR`` when it is set; build the archive after the jar,
with the variable set, or the JVM starts without the archive (class path mismatch).

Under failure: JVM settings (driver memory, Java options) only take effect if
this call starts the JVM; if a session already exists in the process it is
returned with these runtime settings applied but its JVM unchanged. A JVM
that cannot start raises from here; nothing is retried.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from pyspark.sql import SparkSession

from twinflow.runtime.spark.local_fs import jar_conf
from twinflow.runtime.spark.shard_source import register_shard_source
from twinflow.runtime.spark.source import register_source

CDS_ENV = "TWINFLOW_SPARK_CDS"
_MODULE = "twinflow.runtime.spark.session"
# SerialGC + C1 only: measured about 2 s faster start, fine for a small heap. A heap that
# starts at 32 MiB (the JVM's default is 1/64 of the machine's memory, 384 MiB here, most of it
# touched as eden), a smaller code cache and thread stacks: a node's JVM 401 -> 321 MiB idle.
JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xms32m -XX:ReservedCodeCacheSize=64m -Xss512k"

BASE_CONF = {
    # Less than 512m fails at start-up on this machine.
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": JAVA_OPTIONS,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Batches are small; one shuffle partition avoids scheduling idle tasks.
    "spark.sql.shuffle.partitions": "1",
    # Without Hadoop's native library the default manager forks shell commands
    # for every checkpoint file operation; this one forks far fewer (Hadoop
    # still runs `chmod` once per new file). Part of the measured 155 -> 55 ms.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    # Local checkpoint files (file://) without Hadoop's .crc companions: each companion is one
    # more file, and so one more forked `chmod`, per log entry; the two log writes of a
    # micro-batch went from about 9 to 5 ms each (lastProgress durationMs walCommit and
    # commitOffsets at 2,000 msg/s). Other schemes (hdfs://, s3a://) are untouched.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


# A local driver: Python workers started as needed, not forked by a daemon per kind of work. The
# daemons (data source lookup, creation, read planning) and the worker each keeps idle held
# about 360 MiB of a node's 1,060 after the query started, for work a query does once at start.
# Executors of a real cluster keep their daemon: they run a Python task every batch.
LOCAL_CONF = {"spark.python.use.daemon": "false"}


def _numpy_converters_without_imports() -> None:
    """Make PySpark's two NumPy argument converters for py4j look for NumPy without importing it.

    PySpark asks them about every argument of every call into the JVM, and each asks
    ``pyspark.testing.utils`` whether NumPy is installed: importing that module imports pandas,
    pyarrow and NumPy into the driver, which uses none of them (measured: a peer's driver 151 -> 70
    MiB RSS idle). An argument can only be a NumPy value once NumPy is imported, so looking in
    ``sys.modules`` answers alike. Idempotent; converters it does not know are left as they are.
    """
    from py4j import protocol
    from pyspark.sql import types

    def scalar(obj: object) -> bool:
        np = sys.modules.get("numpy")
        return np is not None and isinstance(obj, np.generic)

    def array(obj: object) -> bool:
        np = sys.modules.get("numpy")
        return np is not None and isinstance(obj, np.ndarray) and obj.ndim == 1

    for converter in protocol.INPUT_CONVERTER:
        if type(converter) is types.NumpyScalarConverter:
            converter.can_convert = scalar
        elif type(converter) is types.NumpyArrayConverter:
            converter.can_convert = array


def build_session(
    app_name: str, master: str = "local[1]", extra_conf: dict | None = None
) -> SparkSession:
    """Start (or join) the process's SparkSession with the sources registered.

    ``master`` is any Spark master URL; ``extra_conf`` overrides BASE_CONF.
    """
    # Workers must run this interpreter, or they cannot import redis/twinflow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    local = master.startswith("local")
    # A local driver also writes its checkpoint files without forking `chmod` when the jar is
    # built (local_fs.py; TWINFLOW_SPARK_JAR).
    conf = {**BASE_CONF, **(LOCAL_CONF if local else {}), **jar_conf(local), **(extra_conf or {})}
    archive = os.environ.get(CDS_ENV)
    if archive and os.path.isfile(archive):
        conf["spark.driver.extraJavaOptions"] += f" -XX:SharedArchiveFile={archive}"
    _numpy_converters_without_imports()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_source(spark)
    register_shard_source(spark)
    return spark


def build_cds_archive(path: str, timeout_s: float = 300.0) -> None:
    """Write a class-data-sharing archive for ``build_session`` to ``path``.

    Runs a throwaway driver (a few seconds of streaming through a Python data
    source and foreachBatch) whose JVM dumps the classes it loaded on exit.
    """
    if any(c.isspace() for c in path):
        raise ValueError(f"no whitespace in the archive path, please: {path!r}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    env = {**os.environ, CDS_ENV: ""}
    done = subprocess.run(
        [sys.executable, "-m", _MODULE, "--cds-warmup", partial],
        env=env, stdout=subprocess.PIPE, timeout=timeout_s, check=True, text=True,
    )
    found = re.search(r"^JVM_PID=(\d+)$", done.stdout, re.M)
    if not found:
        raise RuntimeError(f"the warm-up driver did not report its JVM:\n{done.stdout}")
    jvm_pid = int(found.group(1))
    # The JVM writes the archive after our child exits; wait for it to finish.
    deadline = time.monotonic() + timeout_s
    while os.path.exists(f"/proc/{jvm_pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.path.exists(f"/proc/{jvm_pid}") or not os.path.getsize(partial):
        raise RuntimeError(f"the JVM (pid {jvm_pid}) did not finish writing {partial}")
    os.replace(partial, path)


def _cds_warmup(partial: str) -> None:
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

    class Reader(SimpleDataSourceStreamReader):
        def initialOffset(self):
            return {"n": 0}

        def read(self, start):
            return iter([(str(start["n"]), b"x")]), {"n": start["n"] + 1}

        def readBetweenOffsets(self, start, end):
            return iter([(str(start["n"]), b"x")])

    class Warmup(DataSource):
        @classmethod
        def name(cls):
            return "twinflow_cds_warmup"

        def schema(self):
            return "position STRING, data BINARY"

        def simpleStreamReader(self, schema):
            return Reader()

    # -Xlog: hush the dump's list of classes it cannot archive (harmless).
    options = f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=error"
    spark = build_session("twinflow-cds", extra_conf={"spark.driver.extraJavaOptions": options})
    spark.dataSource.register(Warmup)
    batches: list = []
    checkpoint = tempfile.mkdtemp(prefix="twinflow-cds-")
    query = (
        spark.readStream.format("twinflow_cds_warmup").load()
        .writeStream.foreachBatch(lambda df, batch_id: batches.append(df.collect()))
        .trigger(processingTime="0 seconds")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    deadline = time.monotonic() + 120
    while len(batches) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    spark.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    print(f"JVM_PID={jvm_pid}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--build-cds":
        build_cds_archive(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--cds-warmup":
        _cds_warmup(sys.argv[2])
    else:
        sys.exit(f"usage: python -m {_MODULE} --build-cds PATH")
