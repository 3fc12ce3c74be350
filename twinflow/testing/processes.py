"""Start, watch and stop ``twinflow run`` peer processes (demo, tests, benchmarks).

Each peer runs in its own process group so that a SIGKILL takes its Spark
JVM with it. ``stop()`` ends a peer by PID: SIGTERM (graceful handover),
then SIGKILL after the deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .proc_stats import process_group


@dataclass
class PeerProcess:
    peer_id: str
    flow_path: str
    redis_url: str
    zk_hosts: str
    state_dir: str
    log_path: str
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def start(self) -> "PeerProcess":
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "twinflow.cli", "run", self.flow_path, "--peer-id", self.peer_id,
                "--redis", self.redis_url, "--zk", self.zk_hosts, "--state-dir", self.state_dir,
                *self.extra_args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP the peer's whole process group (its JVM too): it neither runs nor answers."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def pause_jvm(self) -> None:
        """SIGSTOP every process of the peer's group but the peer itself (its Spark JVM): its
        micro-batches stop while its Python side, and so its ZooKeeper session, goes on. A master
        paused so stays master and processes nothing for as long as a test needs."""
        for pid in process_group(self.proc.pid):
            if pid != self.proc.pid:
                os.kill(pid, signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT after :meth:`pause` (harmless when not paused or gone)."""
        try:
            os.killpg(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the peer and everything in its process group (its JVM)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def terminate(self, deadline_s: float = 20.0) -> int | None:
        """SIGTERM (graceful: hands the master role over), then SIGKILL at the deadline."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        finally:
            try:  # the JVM child, should it outlive its driver
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
