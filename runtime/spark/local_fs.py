"""The driver's checkpoint files written without a forked ``chmod`` (opt-in, needs a JDK to build).

Hadoop's local file system sets each new file's permission by running ``chmod`` in a child
process when Hadoop's native library is missing, and PySpark ships none. A streaming query
writes two checkpoint files a micro-batch (its offset and its commit log), so every batch
forked the driver's JVM twice: about 4-5 ms each here (a bare query at 2,000 msg/s, Spark's
``durationMs``: ``walCommit`` and ``commitOffsets`` 5-6.5 -> 1-2 ms each, docs/performance/throughput.md).
``NoForkLocalFileSystem.java``, beside this module, is Hadoop's raw local file system with the
same permission bits set in the JVM (``java.nio``).

Build the jar once per machine and PySpark version and point ``TWINFLOW_SPARK_JAR`` at it;
``session.build_session`` then uses it for the ``file:`` scheme of a local driver::

    python -m twinflow.runtime.spark.local_fs /var/cache/twinflow/twinflow-spark.jar
    export TWINFLOW_SPARK_JAR=/var/cache/twinflow/twinflow-spark.jar

Build the class-data-sharing archive (``session.py``) with the variable set, after the jar: a
driver whose class path holds a jar the archive was built without starts without the archive
(correct, but a few seconds slower; the JVM logs "shared class paths mismatch").

Under failure: :func:`build_jar` raises, with javac's output, when there is no ``javac`` or it
fails, and the jar only ever appears complete (written aside, renamed). :func:`jar_conf` adds
nothing when the variable is unset or names no file, and only the class path for a driver on a
real cluster (its executors would not have the jar): Hadoop's own file system then forks
``chmod``, which is correct, only slower.
Permission bits beyond read/write/execute (sticky, setuid, setgid) are set Hadoop's own way.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

JAR_ENV = "TWINFLOW_SPARK_JAR"
FILE_SYSTEM = "twinflow.spark.NoForkLocalFileSystem"
SOURCE = Path(__file__).with_name("NoForkLocalFileSystem.java")


def jar_conf(local: bool, environ=os.environ) -> dict[str, str]:
    """Spark settings: the jar on the driver's class path, and for a ``local`` driver its file
    system for ``file:``; none when ``TWINFLOW_SPARK_JAR`` is unset or names no file.

    Every driver gets the class path, so that one class-data-sharing archive fits them all; only
    a local one the file system, since executors elsewhere do not have the jar.

    >>> jar_conf(True, {})
    {}
    >>> jar_conf(True, {JAR_ENV: "/nonexistent/twinflow-spark.jar"})
    {}
    """
    path = environ.get(JAR_ENV)
    if not path or not os.path.isfile(path):
        return {}
    conf = {"spark.driver.extraClassPath": os.path.abspath(path)}
    if local:
        conf["spark.hadoop.fs.file.impl"] = FILE_SYSTEM
    return conf


def hadoop_jar() -> str:
    """The Hadoop API jar PySpark ships, which the file system compiles against."""
    import pyspark

    found = sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")))
    if not found:
        raise RuntimeError("no hadoop-client-api jar in PySpark's jars directory")
    return found[-1]


def build_jar(path: str, javac: str | None = None) -> None:
    """Compile ``NoForkLocalFileSystem.java`` into a jar at ``path`` (needs ``javac``, Java 17+)."""
    javac = javac or shutil.which("javac")
    if javac is None:
        raise RuntimeError("no javac on PATH: building the jar needs a JDK (apt-get install openjdk-17-jdk-headless)")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="twinflow-jar-") as classes:
        done = subprocess.run([javac, "--release", "17", "-cp", hadoop_jar(), "-d", classes, str(SOURCE)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        partial = f"{path}.{os.getpid()}.partial"
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
                for cls in sorted(Path(classes).rglob("*.class")):
                    jar.write(cls, cls.relative_to(classes).as_posix())
            os.replace(partial, path)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m twinflow.runtime.spark.local_fs JAR_PATH")
    build_jar(sys.argv[1])
