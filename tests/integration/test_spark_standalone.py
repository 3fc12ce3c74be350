"""A real Spark standalone cluster on loopback: tasks run in an executor process, under the
venv's Python, where twinflow imports."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

import twinflow
from twinflow.testing.servers import pid_alive
from twinflow.testing.spark_standalone import StandaloneSpark
from twinflow.runtime.spark.session import build_session


def test_tasks_run_on_the_executor_with_twinflow_importable(tmp_path):
    cluster = StandaloneSpark.start(str(tmp_path / "spark"), cores=2, memory="1g")
    try:
        assert cluster.master_url == f"spark://127.0.0.1:{cluster.master_port}"
        [worker] = cluster.alive_workers()
        assert worker["cores"] == 2 and worker["memory"] == 1024
        ours = SparkSession.getActiveSession() is None
        spark = build_session(
            "twinflow-test-standalone", master=cluster.master_url,
            # Less than the worker offers, and the driver's fast-start JVM flags: a quicker executor.
            extra_conf={"spark.executor.memory": "512m",
                        "spark.executor.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"},
        )
        try:
            # build_session joins a session that is already running in this process.
            assert spark.sparkContext.master == cluster.master_url, "another session was already active"
            # Lambdas, not functions of this module: cloudpickle sends a module-level function by
            # reference, and the executor cannot import the tests package.
            rows = spark.sparkContext.parallelize(range(4), 2).map(lambda x: (x, os.getpid())).collect()
            assert [x for x, _ in rows] == [0, 1, 2, 3]
            assert os.getpid() not in {pid for _, pid in rows}
            files = spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("twinflow").__file__)
            assert set(files.collect()) == {twinflow.__file__}  # the venv's twinflow, imported by the venv's Python
            # The tasks ran in an executor the worker launched (not in a local-mode driver).
            assert any(p.name == "stderr" for p in (tmp_path / "spark" / "work").rglob("*"))
        finally:
            if ours:
                spark.stop()
    finally:
        cluster.stop()
    assert not pid_alive(cluster.worker_pid) and not pid_alive(cluster.master_pid)
