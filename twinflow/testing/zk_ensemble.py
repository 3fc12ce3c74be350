"""A ZooKeeper ensemble on loopback, for the drill that restarts the server leading it.

Every member is a real ZooKeeper server started and stopped by PID (see :mod:`.servers`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .servers import Server, ServiceError, free_port, kill_pid, log_tail, pid_alive, server_reply, start_zookeeper, stop_pid


@dataclass
class LocalZkEnsemble:
    """A ZooKeeper ensemble of ``n`` servers on loopback (a quorum of n // 2 + 1), owned by
    this object: for the drill that restarts the server leading it (``zk-member-restart``).

    Each member has its own data directory, ``myid``, client port and quorum
    ports; :meth:`restart` kills one by PID and starts it again on the same
    ports and data. ``stop()`` ends them all by PID.
    """

    base_dir: str
    servers: list[Server] = field(default_factory=list)
    quorum: str = ""          # the server.N lines every member's zoo.cfg holds

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    @classmethod
    def start(cls, base_dir: str, n: int = 3, deadline_s: float = 60.0) -> "LocalZkEnsemble":
        ens = cls(base_dir)
        ports = [(free_port(), free_port(), free_port()) for _ in range(n)]  # client, peer, election
        ens.quorum = "".join(f"server.{i + 1}=127.0.0.1:{peer}:{election}\n"
                             for i, (_, peer, election) in enumerate(ports))
        try:
            for i, (client, _, _) in enumerate(ports):
                ens.servers.append(ens._start_member(i, client))
            ens.wait_serving(deadline_s)
        except BaseException:
            ens.stop()
            raise
        return ens

    def _start_member(self, i: int, port: int) -> Server:
        return start_zookeeper(Path(self.base_dir) / f"zk{i + 1}", port=port, quorum=self.quorum, myid=i + 1)

    def mode(self, i: int) -> str | None:
        """``leader``, ``follower``, or None while member ``i`` serves no clients."""
        answer = server_reply(self.servers[i].port, b"srvr").decode(errors="replace")
        for line in answer.splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None

    def leader(self) -> int | None:
        return next((i for i in range(len(self.servers)) if self.mode(i) == "leader"), None)

    def wait_serving(self, deadline_s: float) -> None:
        """Until every live member serves and one of them leads, or ServiceError."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            modes = [self.mode(i) for i in range(len(self.servers)) if pid_alive(self.servers[i].pid)]
            if modes and None not in modes and "leader" in modes:
                return
            time.sleep(0.1)
        raise ServiceError(f"the ZooKeeper ensemble did not elect a leader within {deadline_s:.0f} s:\n"
                           + "\n".join(log_tail(s.log, 10) for s in self.servers))

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and wait (bounded) until it is gone."""
        kill_pid(self.servers[i].pid)

    def start_again(self, i: int, deadline_s: float = 60.0) -> None:
        """Start member ``i`` again on its ports and data; wait until the ensemble serves."""
        self.servers[i] = self._start_member(i, self.servers[i].port)
        self.wait_serving(deadline_s)

    def stop(self, deadline_s: float = 10.0) -> None:
        for s in self.servers:
            stop_pid(s.pid, deadline_s)
