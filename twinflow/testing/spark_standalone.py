"""A real Spark standalone cluster (one master, one worker) on loopback, for tests and benches.

``StandaloneSpark.start(base_dir)`` runs PySpark's own ``spark-class`` twice:
a ``Master`` and a ``Worker`` offering ``cores`` and ``memory``, each a child
process with its own session (process group) and log file under
``base_dir``. It returns once the master's web UI (``/json/``) lists the
worker as ALIVE with the expected cores, so a driver can build a session
against :attr:`StandaloneSpark.master_url` straight away. Executors run
``sys.executable`` (the interpreter that started the cluster), so they can
import twinflow. ``stop()`` ends both by PID, worker first.

Under failure: a process that exits, or a cluster that is not ready before
``deadline_s`` (one budget for the whole start), raises :class:`ServiceError`
carrying the tail of both logs, and whatever was already started is stopped.
A port that was free when picked but taken before the JVM bound it is retried
on fresh ports, up to ``PORT_ATTEMPTS`` times per process (Spark is told not
to slide to the next port itself, which would leave ``master_url`` wrong).
``stop()`` never raises for a process that is already gone, and deletes
nothing: ``base_dir`` (logs, work and local dirs) is the caller's.

>>> spark_cluster = StandaloneSpark.start("/tmp/sa")   # doctest: +SKIP
>>> spark_cluster.master_url                             # doctest: +SKIP
'spark://127.0.0.1:40321'
>>> spark_cluster.stop()                                 # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .servers import PORT_ATTEMPTS, PortTaken, ServiceError, free_port, log_tail, pid_alive, spawn, stop_pid

# For the master and worker JVMs (not executors: their options come from the driver's conf).
DAEMON_JAVA_OPTS = " ".join([
    # As the driver in runtime/spark/session.py: SerialGC + C1 start faster; the heaps are small.
    "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
    # Spark otherwise slides to the next port when one is taken: the master would listen
    # somewhere other than master_url says. Fail instead, and retry on fresh ports here.
    "-Dspark.port.maxRetries=0",
    # The REST submission server listens on a fixed port (6066) by default: two clusters
    # would collide, and nothing here submits through it.
    "-Dspark.master.rest.enabled=false",
])
# The master and worker only keep bookkeeping; 1 GB (Spark's default) is far more than needed.
DAEMON_MEMORY = "256m"
_BIND_FAILED = ("BindException", "Address already in use")
_POLL_S = 0.1


def spark_home() -> str:
    """The PySpark package directory: the Spark distribution pip installed (bin/, jars/)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("pyspark is not installed in this interpreter")
    return spec.submodule_search_locations[0]


@dataclass
class StandaloneSpark:
    """A running standalone master and worker on 127.0.0.1, owned by this object."""

    base_dir: str
    cores: int = 2
    memory: str = "2g"
    master_port: int = 0
    master_webui_port: int = 0
    worker_webui_port: int = 0
    master_pid: int | None = None
    worker_pid: int | None = None
    master_log: str = ""
    worker_log: str = ""
    work_dir: str = ""          # the worker's: one directory per application and executor (its stdout/stderr)
    local_dir: str = ""         # shuffle and spill files

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.master_webui_port}"

    @classmethod
    def start(cls, base_dir: str, cores: int = 2, memory: str = "2g", deadline_s: float = 90.0) -> "StandaloneSpark":
        """Start the master, then the worker; return when the worker is registered and ALIVE,
        or raise ServiceError (with both log tails) having stopped what was started."""
        base = Path(base_dir)
        spark = cls(base_dir=str(base), cores=cores, memory=memory,
                    work_dir=str(base / "work"), local_dir=str(base / "local"))
        for d in (spark.work_dir, spark.local_dir, base / "conf"):
            Path(d).mkdir(parents=True, exist_ok=True)
        end = time.monotonic() + deadline_s
        try:
            spark._start_master(end)
            spark._start_worker(end)
        except BaseException:
            spark.stop()
            raise
        return spark

    def state(self, timeout_s: float = 1.0) -> dict | None:
        """The master's view (its web UI's /json/: workers, cores, apps), or None if it does not answer."""
        # No proxy: an http_proxy in the environment must not intercept 127.0.0.1.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self.webui_url}/json/", timeout=timeout_s) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict]:
        """The workers the master sees as ALIVE (each a dict from /json/: host, cores, memory in MB)."""
        return [w for w in (self.state() or {}).get("workers", []) if w.get("state") == "ALIVE"]

    def stop(self, deadline_s: float = 10.0) -> None:
        """Stop the worker, then the master, by PID (TERM, then KILL after the deadline)."""
        for pid in (self.worker_pid, self.master_pid):
            if pid:
                stop_pid(pid, deadline_s)
                # The worker kills its executors when TERMed; sweep each process group (a session
                # of its own: executors, their Python workers, spark-class's launcher JVM) in case
                # the leader had to be KILLed or was stopped before spark-class exec'd java.
                _kill_group(pid)

    def logs(self) -> str:
        """The tail of both logs, for a failing test or bench."""
        return "\n".join(f"--- {name} ({log}) ---\n{log_tail(log)}"
                         for name, log in (("master", self.master_log), ("worker", self.worker_log)) if log)

    # -- start-up ----------------------------------------------------------------------------

    def _spark_class(self, main: str, *args: str) -> list[str]:
        env = daemon_env("127.0.0.1", self.local_dir, self.work_dir, str(Path(self.base_dir) / "conf"))
        return spark_class(env, main, *args)

    def _start_master(self, end: float) -> None:
        self.master_log = str(Path(self.base_dir) / "master.log")
        for attempt in range(PORT_ATTEMPTS):
            self.master_port, self.master_webui_port = free_port(), free_port()
            self.master_pid = spawn(self._spark_class(
                "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.master_port), "--webui-port", str(self.master_webui_port)),
                Path(self.master_log))
            try:
                # The URL check also rules out some other server that took the web UI's port.
                self._wait(end, "the master", lambda s: s.get("status") == "ALIVE" and s.get("url") == self.master_url)
                return
            except PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self._set_aside(self.master_log, self.master_port)

    def _start_worker(self, end: float) -> None:
        self.worker_log = str(Path(self.base_dir) / "worker.log")
        for attempt in range(PORT_ATTEMPTS):
            # The worker's RPC port is Spark's pick (port 0): it tells the master itself.
            self.worker_webui_port = free_port()
            self.worker_pid = spawn(self._spark_class(
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", str(self.worker_webui_port), "--work-dir", self.work_dir, self.master_url),
                Path(self.worker_log))
            try:
                self._wait(end, f"a worker with {self.cores} cores", lambda s: any(
                    w.get("state") == "ALIVE" and w.get("cores") == self.cores and w.get("host") == "127.0.0.1"
                    for w in s.get("workers", [])))
                return
            except PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self._set_aside(self.worker_log, self.worker_webui_port)

    def _wait(self, end: float, what: str, ready) -> None:
        """Poll the master's /json/ until ``ready(state)``; raise if a started process exits
        (PortTaken when its log says it could not bind) or at ``end``."""
        while True:
            state = self.state(timeout_s=1.0)
            if state is not None and ready(state):
                return
            for name, pid, log in (("master", self.master_pid, self.master_log),
                                   ("worker", self.worker_pid, self.worker_log)):
                if pid and not pid_alive(pid):
                    tail = log_tail(log)
                    error = PortTaken if any(s in tail for s in _BIND_FAILED) else ServiceError
                    raise error(f"the Spark {name} (pid {pid}) exited while waiting for {what}:\n{self.logs()}")
            if time.monotonic() > end:
                raise ServiceError(f"no {what} at {self.webui_url}/json/ before the deadline "
                                   f"(last state: {state}):\n{self.logs()}")
            time.sleep(_POLL_S)

    @staticmethod
    def _set_aside(log: str, port: int) -> None:
        # Keep the failed start's log for a reader, out of the next one's way.
        Path(log).replace(f"{log}.port-{port}")


def daemon_env(local_ip: str, local_dir: str, work_dir: str, conf_dir: str) -> dict[str, str]:
    """The environment of a master or worker daemon bound to ``local_ip`` (127.0.0.1 here; a lab
    host's address in :mod:`.lab_hosts`)."""
    return {
        "SPARK_HOME": spark_home(),
        # Binds the RPC endpoints' and web UIs' listeners (and the executors') to that address.
        "SPARK_LOCAL_IP": local_ip,
        "SPARK_LOCAL_DIRS": local_dir,
        "SPARK_WORKER_DIR": work_dir,
        # An empty conf dir of our own: no spark-env.sh or defaults from the caller's setup.
        "SPARK_CONF_DIR": conf_dir,
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTS,
        # Executors start this interpreter for Python tasks (unless the driver names another).
        "PYSPARK_PYTHON": sys.executable,
    }


def spark_class(env: dict[str, str], main: str, *args: str) -> list[str]:
    """The command that runs the daemon ``main`` with ``env``: ``env`` passes the variables without
    touching this process's environment and exec()s spark-class, which exec()s java, so the PID of
    the process started is the JVM's."""
    return ["env", *(f"{k}={v}" for k, v in env.items()), str(Path(spark_home()) / "bin" / "spark-class"),
            main, *args]


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group we created (its leader is already gone).

    A process group keeps its ID while any member lives, so the kernel cannot hand the
    number to an unrelated group in the meantime.
    """
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
