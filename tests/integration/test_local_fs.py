"""The checkpoint file system of ``runtime/spark/local_fs.py``, in real Spark drivers.

Each driver runs in a child process (a JVM's class path is fixed at its start) whose PATH
begins with a ``chmod`` that records each call and then does the real one: Hadoop's own local
file system calls it for every checkpoint file, the jar's must not, and both must leave the
same permission bits.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from twinflow.runtime.spark.local_fs import FILE_SYSTEM, JAR_ENV, build_jar, jar_conf

# A streaming query of Spark's own rate source: three micro-batches, each writing an offset and
# a commit log file to the checkpoint; prints the file system Spark used for it.
DRIVER = textwrap.dedent("""
    import json, sys, time
    from twinflow.runtime.spark.session import build_session
    spark = build_session("twinflow-test-local-fs")
    batches = []
    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
             .writeStream.foreachBatch(lambda df, batch_id: batches.append(batch_id))
             .option("checkpointLocation", sys.argv[1]).start())
    deadline = time.monotonic() + 120
    while len(batches) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    jvm = spark.sparkContext._jvm
    fs = jvm.org.apache.hadoop.fs.Path("file://" + sys.argv[1]).getFileSystem(
        spark.sparkContext._jsc.hadoopConfiguration())
    print(json.dumps({"batches": len(batches), "fs": fs.getClass().getName()}))
    spark.stop()
""")


@pytest.fixture(scope="module")
def jar(tmp_path_factory):
    # `make test`'s bootstrap installs a JDK when javac is missing, so this skips only outside it.
    if shutil.which("javac") is None:
        pytest.skip("building the jar needs a JDK's javac (scripts/bootstrap.sh installs it)")
    path = tmp_path_factory.mktemp("jar") / "twinflow-spark.jar"
    build_jar(str(path))
    return path


def start_driver(tmp_path, jar_path):
    """Start DRIVER with ``jar_path`` (or none); :func:`driver_result` waits for it."""
    bin_dir, log = tmp_path / "bin", tmp_path / "chmod.log"
    bin_dir.mkdir(parents=True)
    real = shutil.which("chmod")
    wrapper = bin_dir / "chmod"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", JAR_ENV: str(jar_path or "")}
    checkpoint = tmp_path / "checkpoint"
    # Its log to a file, not a pipe: the other driver's pipe is not read while this one runs.
    with open(tmp_path / "driver.log", "w") as err:
        # A process umask other than Hadoop's own (fs.permissions.umask-mode, 022): a file system
        # that did not set the bits at all would leave the process's 0600 instead of Hadoop's 0644.
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(checkpoint)], env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True, umask=0o077)
    return proc, log, str(checkpoint)


def driver_result(started) -> tuple[dict, list[str], str]:
    """The driver's report, the chmod calls it made, its checkpoint directory."""
    proc, log, checkpoint = started
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, (log.parent / "driver.log").read_text()[-3000:]
    calls = log.read_text().splitlines() if log.exists() else []
    return json.loads(out.strip().splitlines()[-1]), calls, checkpoint


def modes(checkpoint: str) -> set[int]:
    """The permission bits of every offset and commit log file."""
    return {stat.S_IMODE(os.stat(os.path.join(checkpoint, d, f)).st_mode)
            for d in ("offsets", "commits") for f in os.listdir(os.path.join(checkpoint, d))}


def test_with_the_jar_a_local_driver_writes_its_checkpoint_without_forking_chmod(tmp_path, jar):
    # Both drivers at once: each JVM takes seconds to start.
    own_driver, hadoop_driver = start_driver(tmp_path / "own", jar), start_driver(tmp_path / "hadoop", None)
    own, own_calls, own_checkpoint = driver_result(own_driver)
    hadoop, hadoop_calls, hadoop_checkpoint = driver_result(hadoop_driver)

    assert own["batches"] >= 3 and hadoop["batches"] >= 3
    assert own["fs"] == FILE_SYSTEM
    assert hadoop["fs"] == "org.apache.hadoop.fs.RawLocalFileSystem"
    # Hadoop's own forks chmod for each log file (so the wrapper would have seen the jar's, too).
    assert len(hadoop_calls) >= 6
    assert own_calls == []
    # The same bits either way: a file's default (0666) less Hadoop's umask (022), not the process's.
    assert modes(own_checkpoint) == modes(hadoop_checkpoint) == {0o644}


def test_a_driver_on_a_real_cluster_gets_the_class_path_but_not_the_file_system(jar):
    conf = jar_conf(False, {JAR_ENV: str(jar)})
    assert conf == {"spark.driver.extraClassPath": str(jar)}
    assert jar_conf(True, {JAR_ENV: str(jar)})["spark.hadoop.fs.file.impl"] == FILE_SYSTEM


def test_a_failed_build_says_why_and_leaves_no_jar(tmp_path):
    javac = tmp_path / "javac"
    javac.write_text("#!/bin/sh\necho 'error: no room on the device' >&2\nexit 2\n")
    javac.chmod(0o755)
    target = tmp_path / "out" / "twinflow-spark.jar"
    with pytest.raises(RuntimeError, match="no room on the device"):
        build_jar(str(target), javac=str(javac))
    assert list((tmp_path / "out").iterdir()) == []
