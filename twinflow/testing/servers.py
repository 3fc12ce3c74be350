"""The parts every local server shares: free ports, starting a process in a session of its own,
waiting until it answers, stopping it by PID, and the Redis and ZooKeeper start commands.

:mod:`.services` (Redis and ZooKeeper for a flow, a secured Redis), :mod:`.redis_ha`
(Sentinel, Redis Cluster), :mod:`.zk_ensemble` and :mod:`.spark_standalone` build on it.

Under failure: a server that exits or does not answer before its deadline raises
:class:`ServiceError` carrying the tail of its log. A port that was free when picked but
taken before the server bound it (outgoing connections draw from the same range) is retried
on a fresh port, up to ``PORT_ATTEMPTS`` times. :func:`stop_pid` never raises for a process
that is already gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ZK_CLASSPATH = ":".join(
    ["/etc/zookeeper/conf", "/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar"]
)
# tickTime=200 and minSessionTimeout=1000: without them ZooKeeper stretches a
# requested 2 s session to 4 s (2 x the default 2 s tick), doubling failover
# time. The server expires sessions in buckets of one tick, so a dead master's
# session ends up to one tick after its time-out: 200 ms rather than 500 ms
# (docs/performance.md, "The test suite"). initLimit and syncLimit count ticks: 5 s and 2 s.
ZOO_CFG = """\
tickTime=200
minSessionTimeout=1000
maxSessionTimeout=60000
initLimit=25
syncLimit=10
dataDir={data_dir}
clientPort={port}
clientPortAddress={address}
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
"""


class ServiceError(RuntimeError):
    """A local server failed to start or answer; the message holds its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _answers(port: int, request: bytes, reply_prefix: bytes | tuple[bytes, ...], timeout: float,
             tls: ssl.SSLContext | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            with tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw as s:
                s.sendall(request)
                return s.recv(16).startswith(reply_prefix)
    except OSError:  # ssl.SSLError too: a server still starting may cut the handshake
        return False


def redis_answers(port: int, timeout: float = 0.5) -> bool:
    """True when a Redis server on 127.0.0.1:port answers PING."""
    return _answers(port, b"*1\r\n$4\r\nPING\r\n", b"+PONG", timeout)


def zk_answers(port: int, timeout: float = 0.5) -> bool:
    """True when a ZooKeeper server on 127.0.0.1:port answers ``ruok``."""
    return _answers(port, b"ruok", b"imok", timeout)


@dataclass
class Server:
    """One started server: what it is, where it listens, its PID and its log.

    A Redis that asks for a password (``secured``) answers PING with NOAUTH,
    which is enough to know it serves; one that speaks TLS only (``tls_ca``:
    the CA of its certificate, ``tls_cert``/``tls_key``: a client certificate
    when it checks clients) is probed over TLS.
    """

    name: str
    port: int
    pid: int
    log: str
    secured: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    def answers(self) -> bool:
        if self.name != "redis":
            return zk_answers(self.port)
        if not (self.secured or self.tls_ca):
            return redis_answers(self.port)
        tls = None
        if self.tls_ca:
            tls = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                tls.load_cert_chain(self.tls_cert, self.tls_key)
        return _answers(self.port, b"*1\r\n$4\r\nPING\r\n", (b"+PONG", b"-NOAUTH"), 0.5, tls)


def spawn(argv: list[str], log_path: Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # A session of its own: the server outlives `twinflow services up`
        # and a Ctrl-C in the demo's terminal does not reach it first.
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


def start_redis(directory: Path, *extra: str, port: int | None = None, config: Path | None = None,
                 tls: bool = False) -> Server:
    """A redis-server in ``directory``; ``config``: a file read first (redis-server wants it as its first
    argument); ``tls``: the port speaks TLS only (no plain port at all)."""
    if shutil.which("redis-server") is None:
        raise ServiceError("redis-server is not installed (apt-get install redis-server, or run `make test`)")
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = directory / "redis.log"
    pid = spawn(redis_argv(directory, *extra, port=port, config=config, tls=tls), log)
    return Server("redis", port, pid, str(log))


def redis_argv(directory: Path, *extra: str, port: int, bind: str = "127.0.0.1", config: Path | None = None,
               tls: bool = False) -> list[str]:
    """The ``redis-server`` command of :func:`start_redis` (and of a lab host's Redis, bound to ``bind``)."""
    listen = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
    # What the promises need (docs/operations/redis.md): nothing evicted,
    # the epoch, ID cache and processed mark kept across a restart.
    return ["redis-server", *([str(config)] if config else []), *listen, "--bind", bind, "--save", "",
            "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
            "--dir", str(directory), "--protected-mode", "yes", *extra]


def conf_quote(value: str) -> str:
    """``value`` as one argument of a redis.conf line (a double-quoted string, escapes as redis reads them)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def replica_synced(port: int, password: str = "") -> bool:
    """True for a primary, and for a replica whose link to its primary is up."""
    auth = b""
    if password:
        pw = password.encode()
        auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)
    info = server_reply(port, auth + b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n")
    return b"role:master" in info or b"master_link_status:up" in info


def kill_pid(pid: int, deadline_s: float = 10.0) -> None:
    """SIGKILL ``pid`` and wait (bounded) until it is gone."""
    _signal_and_wait(pid, signal.SIGKILL, deadline_s, 0.02)


def cluster_ok(port: int) -> bool:
    return b"cluster_state:ok" in server_reply(port, b"*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n")


def server_reply(port: int, request: bytes, timeout: float = 0.5) -> bytes:
    """The reply to ``request`` (b"" when the server does not answer within ``timeout``); a RESP
    bulk string (``$<n>``) is read whole, however many segments it comes in."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request)
            reply = sock.recv(65536)
            if reply.startswith(b"$") and b"\r\n" in reply:
                head, _, _ = reply.partition(b"\r\n")
                whole = len(head) + 2 + max(0, int(head[1:])) + 2
                while len(reply) < whole:  # each recv bounded by the socket's timeout
                    more = sock.recv(65536)
                    if not more:
                        break
                    reply += more
            return reply
    except (OSError, ValueError):
        return b""


def start_zookeeper(directory: Path, port: int | None = None, quorum: str = "", myid: int | None = None) -> Server:
    """One ZooKeeper server in ``directory``; with ``quorum`` (server.N lines) and ``myid``, a
    member of an ensemble."""
    if not Path("/usr/share/java/zookeeper.jar").exists():
        raise ServiceError("ZooKeeper is not installed (apt-get install zookeeper, or run `make test`)")
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    if myid is not None:
        (data / "myid").write_text(f"{myid}\n")
    port = port or free_port()
    cfg = directory / "zoo.cfg"
    cfg.write_text(ZOO_CFG.format(data_dir=data, port=port, address="127.0.0.1") + quorum)
    log = directory / "zookeeper.log"
    pid = spawn(zookeeper_argv(directory, cfg), log)
    return Server("zookeeper", port, pid, str(log))


def zookeeper_argv(directory: Path, cfg: Path) -> list[str]:
    """The ZooKeeper server command of :func:`start_zookeeper` (and of a lab host's), given its zoo.cfg."""
    return ["java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.log.dir=" + str(directory), "-cp", ZK_CLASSPATH,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)]


class PortTaken(ServiceError):
    """The port picked for a server was bound by someone else before it started."""


# How many ports a start tries: a port free when picked can be taken by any
# outgoing connection on the machine (both come from the ephemeral range)
# before a JVM that takes a second to start binds it.
PORT_ATTEMPTS = 5


def start_answering(start: Callable[[Path], Server], directory: Path, deadline_s: float) -> Server:
    """Start a server and wait until it answers, on a fresh port when the picked one was taken."""
    for attempt in range(PORT_ATTEMPTS):
        server = start(directory)
        try:
            wait_answering(server, deadline_s)
            return server
        except PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
            # Keep the failed start's log for a reader, out of the next one's way.
            Path(server.log).replace(f"{server.log}.port-{server.port}")
    raise AssertionError("unreachable")


def wait_answering(server: Server, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if server.answers():
            return
        if not pid_alive(server.pid):
            log = log_tail(server.log)
            error = PortTaken if "Address already in use" in log else ServiceError
            raise error(f"{server.name} exited during start-up; log:\n{log}")
        time.sleep(0.05)
    raise ServiceError(
        f"{server.name} on 127.0.0.1:{server.port} did not answer within {deadline_s:.0f} s; "
        f"log:\n{log_tail(server.log)}"
    )


def _signal_and_wait(pid: int, sig: int, deadline_s: float, poll_s: float) -> bool:
    """Send ``sig`` to ``pid`` and wait (bounded) until it is gone; True once it is."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and pid_alive(pid):
        time.sleep(poll_s)
    return not pid_alive(pid)


def stop_pid(pid: int, deadline_s: float) -> None:
    """SIGTERM ``pid``, and SIGKILL it if it is still there after ``deadline_s``."""
    if not _signal_and_wait(pid, signal.SIGTERM, deadline_s, 0.05):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
