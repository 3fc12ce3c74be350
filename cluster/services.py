"""Local Redis and ZooKeeper for development, tests and the demo.

``LocalServices.start()`` runs a real ``redis-server`` and a real standalone
ZooKeeper (Debian's packages) on free loopback ports with temporary data
directories, waits until each answers, and ``stop()`` ends them by PID. The
state (PIDs, ports, directories) can be saved to a JSON file so that
``twinflow services up`` can return while the servers keep running and
``twinflow services down`` can stop them later.

Under failure: a server that exits or does not answer before its deadline
raises :class:`ServiceError` carrying the tail of its log, and whatever was
already started is stopped. A port that was free when picked but taken
before the server bound it (outgoing connections draw from the same range)
is retried on a fresh port, up to ``PORT_ATTEMPTS`` times. ``stop()`` never raises for a server that is
already gone.

>>> svc = LocalServices.start()          # doctest: +SKIP
>>> svc.redis_url, svc.zk_hosts           # doctest: +SKIP
('redis://127.0.0.1:40211/0', '127.0.0.1:40213')
>>> svc.stop()                            # doctest: +SKIP

:class:`LocalRedis` runs one ``redis-server`` that asks for a password
(``requirepass``), for an ACL user's (the ``default`` user then off), and/or
speaks TLS only, for the tests of Redis credentials and TLS:

>>> r = LocalRedis.start(tmp, password="pw", user="app",
...                      tls=RedisTls(cert, key, ca))   # doctest: +SKIP
>>> r.url                                                # doctest: +SKIP
'rediss://app@127.0.0.1:40215/0'
>>> r.stop()                                             # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ZK_CLASSPATH = ":".join(
    ["/etc/zookeeper/conf", "/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar"]
)
# tickTime=200 and minSessionTimeout=1000: without them ZooKeeper stretches a
# requested 2 s session to 4 s (2 x the default 2 s tick), doubling failover
# time. The server expires sessions in buckets of one tick, so a dead master's
# session ends up to one tick after its time-out: 200 ms rather than 500 ms
# (CHANGELOG.md, 2026-11-23). initLimit and syncLimit count ticks: 5 s and 2 s.
ZOO_CFG = """\
tickTime=200
minSessionTimeout=1000
maxSessionTimeout=60000
initLimit=25
syncLimit=10
dataDir={data_dir}
clientPort={port}
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
"""


class ServiceError(RuntimeError):
    """A local server failed to start or answer; the message holds its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _pid_alive(pid: int) -> bool:
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


@dataclass
class LocalServices:
    """A running Redis and ZooKeeper pair on loopback, owned by this object."""

    base_dir: str
    servers: list[Server] = field(default_factory=list)
    owns_base_dir: bool = True

    @property
    def redis(self) -> Server:
        return next(s for s in self.servers if s.name == "redis")

    @property
    def zookeeper(self) -> Server:
        return next(s for s in self.servers if s.name == "zookeeper")

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis.port}/0"

    @property
    def zk_hosts(self) -> str:
        return f"127.0.0.1:{self.zookeeper.port}"

    @classmethod
    def start(cls, base_dir: str | None = None, deadline_s: float = 30.0, zookeeper: bool = True,
              redis: bool = True) -> "LocalServices":
        """Start both servers (Redis alone without ``zookeeper``, ZooKeeper alone without
        ``redis``) and wait until each answers, or raise ServiceError."""
        owns = base_dir is None
        base = base_dir or tempfile.mkdtemp(prefix="twinflow-services-")
        svc = cls(base_dir=base, owns_base_dir=owns)
        try:
            if redis:
                svc.servers.append(_start_answering(_start_redis, Path(base) / "redis", deadline_s))
            if zookeeper:
                svc.servers.append(_start_answering(_start_zookeeper, Path(base) / "zookeeper", deadline_s))
        except BaseException:
            svc.stop()
            raise
        return svc

    def status(self) -> dict[str, dict]:
        """Per server: address, PID, whether the process lives and answers."""
        return {
            s.name: {
                "address": f"127.0.0.1:{s.port}",
                "pid": s.pid,
                "alive": _pid_alive(s.pid),
                "answers": s.answers(),
                "log": s.log,
            }
            for s in self.servers
        }

    def stop(self, deadline_s: float = 10.0) -> None:
        """Stop every server by PID (TERM, then KILL after the deadline)."""
        for s in self.servers:
            _stop_pid(s.pid, deadline_s)
        if self.owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def stop_redis(self, deadline_s: float = 10.0) -> None:
        """Stop Redis by PID (TERM: it writes its append-only file first)."""
        _stop_pid(self.redis.pid, deadline_s)

    def start_redis_again(self, deadline_s: float = 30.0) -> None:
        """Start Redis again on its port and data directory (it reloads its append-only file)."""
        old = self.redis
        server = _start_redis(Path(old.log).parent, port=old.port)
        self.servers[self.servers.index(old)] = server
        _wait_answering(server, deadline_s)

    def logs(self) -> str:
        """The tail of every server's log, for a failing test or command."""
        return "\n".join(f"--- {s.name} ({s.log}) ---\n{_log_tail(s.log)}" for s in self.servers)

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LocalServices":
        raw = json.loads(Path(path).read_text())
        raw["servers"] = [Server(**s) for s in raw["servers"]]
        return cls(**raw)


def _spawn(argv: list[str], log_path: Path) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # A session of its own: the server outlives `twinflow services up`
        # and a Ctrl-C in the demo's terminal does not reach it first.
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


def _start_redis(directory: Path, *extra: str, port: int | None = None, config: Path | None = None,
                 tls: bool = False) -> Server:
    """A redis-server in ``directory``; ``config``: a file read first (redis-server wants it as its first
    argument); ``tls``: the port speaks TLS only (no plain port at all)."""
    if shutil.which("redis-server") is None:
        raise ServiceError("redis-server is not installed (apt-get install redis-server, or run `make test`)")
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = directory / "redis.log"
    listen = ["--port", "0", "--tls-port", str(port)] if tls else ["--port", str(port)]
    pid = _spawn(
        # What the promises need (docs/operations/redis.md): nothing evicted,
        # the epoch, ID cache and processed mark kept across a restart.
        ["redis-server", *([str(config)] if config else []), *listen, "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
         "--dir", str(directory), "--protected-mode", "yes", *extra],
        log,
    )
    return Server("redis", port, pid, str(log))


@dataclass
class RedisTls:
    """TLS files for a :class:`LocalRedis`: its certificate and key, the CA it trusts for clients,
    and whether it asks clients for a certificate (``tls-auth-clients``). ``client_cert`` /
    ``client_key`` are a client certificate for the start-up probe, needed when it asks."""

    cert_file: str
    key_file: str
    ca_file: str
    auth_clients: bool = False
    client_cert: str = ""
    client_key: str = ""


@dataclass
class LocalRedis:
    """One ``redis-server`` on loopback with a password, an ACL user and/or TLS, owned by this object.

    ``password`` alone: ``requirepass``. With ``user``: an ACL user with all
    rights and that password, and the ``default`` user off, so only that user
    gets in. ``tls``: the port speaks TLS only. The password goes in a
    configuration file (mode 0600) rather than on the command line, where
    ``ps`` shows it. :attr:`url` names no password, as a node is given it.
    ``stop()`` ends the server by PID.
    """

    base_dir: str
    server: Server | None = None
    password: str = ""
    user: str = ""
    tls: RedisTls | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def url(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{'rediss' if self.tls else 'redis'}://{user}127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, base_dir: str, password: str = "", user: str = "", tls: RedisTls | None = None,
              deadline_s: float = 30.0) -> "LocalRedis":
        """Start the server and wait until it answers, or raise ServiceError."""
        if user and not password:
            raise ValueError("an ACL user needs a password here")
        if tls and tls.auth_clients and not tls.client_cert:
            raise ValueError("tls-auth-clients yes: give a client certificate for the start-up probe")
        local = cls(base_dir, password=password, user=user, tls=tls)
        directory = Path(base_dir)
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "secure.conf"
        config.touch(mode=0o600)
        config.write_text(local._config())

        def start(d: Path) -> Server:
            server = _start_redis(d, config=config, tls=tls is not None)
            server.secured = bool(password)
            if tls:
                server.tls_ca, server.tls_cert, server.tls_key = tls.ca_file, tls.client_cert, tls.client_key
            return server

        try:
            local.server = _start_answering(start, directory, deadline_s)
        except BaseException:
            local.stop()
            raise
        return local

    def _config(self) -> str:
        lines = []
        if self.user:
            # Only the ACL user gets in: a client without a user name is refused.
            lines += ["user default off", f"user {self.user} on {_conf_quote('>' + self.password)} ~* &* +@all"]
        elif self.password:
            lines.append(f"requirepass {_conf_quote(self.password)}")
        if self.tls:
            lines += [f"tls-cert-file {_conf_quote(self.tls.cert_file)}",
                      f"tls-key-file {_conf_quote(self.tls.key_file)}",
                      f"tls-ca-cert-file {_conf_quote(self.tls.ca_file)}",
                      f"tls-auth-clients {'yes' if self.tls.auth_clients else 'no'}"]
        return "".join(f"{line}\n" for line in lines)

    def stop(self, deadline_s: float = 10.0) -> None:
        """Stop the server by PID (TERM, then KILL after the deadline); never raises for one that is gone."""
        if self.server is not None:
            _stop_pid(self.server.pid, deadline_s)

    def logs(self) -> str:
        return "" if self.server is None else f"--- redis ({self.server.log}) ---\n{_log_tail(self.server.log)}"


def _conf_quote(value: str) -> str:
    """``value`` as one argument of a redis.conf line (a double-quoted string, escapes as redis reads them)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


@dataclass
class LocalRedisCluster:
    """A Redis Cluster of ``n`` primaries on loopback, each with ``replicas`` replicas, owned by
    this object.

    For tests, drills and trying a flow on a cluster: each node is a real
    ``redis-server --cluster-enabled yes``; ``redis-cli --cluster create``
    spreads the 16,384 slots over the primaries and gives each its replicas.
    :meth:`kill` SIGKILLs a node by PID, :meth:`start_again` starts it on its
    port and data (a former primary rejoins as a replica of the node that took
    its slots), :meth:`takeover` makes a replica take its primary's slots at
    once. ``stop()`` ends them all by PID.
    """

    base_dir: str
    servers: list[Server] = field(default_factory=list)
    bus_ports: list[int] = field(default_factory=list)
    node_timeout_ms: int = 2000

    @property
    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{s.port}/0" for s in self.servers]

    @classmethod
    def start(cls, base_dir: str, n: int = 3, deadline_s: float = 30.0, replicas: int = 0,
              node_timeout_ms: int = 2000) -> "LocalRedisCluster":
        cluster = cls(base_dir, node_timeout_ms=node_timeout_ms)
        try:
            for i in range(n * (1 + replicas)):
                # The bus port explicitly: the default (port + 10000) fails above port 55535.
                cluster.bus_ports.append(free_port())
                cluster.servers.append(_start_answering(lambda d, i=i: cluster._start_node(d, i),
                                                        Path(base_dir) / f"node{i}", deadline_s))
            addrs = [f"127.0.0.1:{s.port}" for s in cluster.servers]
            done = subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", str(replicas),
                                   "--cluster-yes"], capture_output=True, text=True, timeout=deadline_s)
            if done.returncode != 0:
                raise ServiceError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            cluster.wait_ok(deadline_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_node(self, directory: Path, i: int, port: int | None = None) -> Server:
        return _start_redis(directory, "--cluster-enabled", "yes", "--cluster-node-timeout", str(self.node_timeout_ms),
                            "--cluster-config-file", str(directory / "nodes.conf"),
                            "--cluster-port", str(self.bus_ports[i]), port=port)

    def wait_ok(self, deadline_s: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and every live replica's link to its
        primary is up, or ServiceError."""
        end = time.monotonic() + deadline_s
        while True:
            live = [s for s in self.servers if _pid_alive(s.pid)]
            if all(_cluster_ok(s.port) for s in live) and all(_replica_synced(s.port) for s in live):
                return
            if time.monotonic() > end:
                raise ServiceError(f"the Redis Cluster did not reach cluster_state:ok within {deadline_s:.0f} s")
            time.sleep(0.05)

    def owner(self, key: str) -> int:
        """The index in ``servers`` of the primary that serves ``key``'s slot, as a live node says."""
        import redis

        for s in self.servers:
            if not _pid_alive(s.pid):
                continue
            try:
                client = redis.Redis(port=s.port, socket_timeout=2)
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for first, last, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                    if int(first) <= slot <= int(last):
                        return next(i for i, x in enumerate(self.servers) if x.port == int(primary[1]))
            except redis.RedisError:
                continue
            finally:
                client.close()
        raise ServiceError(f"no live node of the Redis Cluster names the owner of {key!r}")

    def replicas_of(self, i: int) -> list[int]:
        """The indexes of the live replicas of primary ``i``, as ``CLUSTER NODES`` on it says."""
        raw = _reply(self.servers[i].port, b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nNODES\r\n").decode(errors="replace")
        lines = [line.split() for line in raw.splitlines()[1:] if len(line.split()) >= 8]
        me = next(f[0] for f in lines if "myself" in f[2].split(","))
        ports = {int(f[1].split("@")[0].rsplit(":", 1)[1]) for f in lines
                 if f[3] == me and "slave" in f[2].split(",") and "fail" not in f[2].split(",")}
        return [j for j, s in enumerate(self.servers) if s.port in ports and _pid_alive(s.pid)]

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` by PID and wait (bounded) until it is gone."""
        _kill_pid(self.servers[i].pid)

    def start_again(self, i: int, deadline_s: float = 30.0) -> None:
        """Start node ``i`` again on its ports and data directory; wait until it answers."""
        old = self.servers[i]
        self.servers[i] = self._start_node(Path(old.log).parent, i, port=old.port)
        _wait_answering(self.servers[i], deadline_s)

    def takeover(self, i: int) -> None:
        """``CLUSTER FAILOVER TAKEOVER`` on replica ``i``: it takes its primary's slots now."""
        import redis

        redis.Redis(port=self.servers[i].port, socket_timeout=5).execute_command("CLUSTER FAILOVER", "TAKEOVER")

    def stop(self, deadline_s: float = 10.0) -> None:
        for s in self.servers:
            _stop_pid(s.pid, deadline_s)


SENTINEL_CONF = """\
port {port}
bind 127.0.0.1
daemonize no
dir {dir}
sentinel monitor {service} 127.0.0.1 {primary} {quorum}
sentinel down-after-milliseconds {service} {down_after_ms}
sentinel failover-timeout {service} {failover_timeout_ms}
sentinel parallel-syncs {service} 1
"""


@dataclass
class LocalSentinel:
    """A Redis primary, ``replicas`` replicas and ``sentinels`` Sentinels on loopback, owned by
    this object: Redis high availability with Sentinel, for tests and the ``redis-failover`` drill.

    Each server is a real ``redis-server`` (a Sentinel is ``redis-server sentinel.conf
    --sentinel``). :attr:`url` is the ``redis+sentinel://`` URL a node is given.
    :meth:`kill` SIGKILLs a data server by PID, :meth:`start_again` starts it on its port
    and data (the Sentinels make a former primary a replica of the new one),
    :meth:`primary` says which server the Sentinels name. ``stop()`` ends them all by PID.
    """

    base_dir: str
    service: str = "mymaster"
    servers: list[Server] = field(default_factory=list)    # data servers; [0] the first primary
    sentinels: list[Server] = field(default_factory=list)
    down_after_ms: int = 1000
    password: str = ""     # requirepass of the data servers (and masterauth, and the Sentinels' auth-pass)

    @property
    def url(self) -> str:
        """The URL a node is given (no password in it: the password goes in TWINFLOW_REDIS_PASSWORD)."""
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.service}/0"

    @classmethod
    def start(cls, base_dir: str, replicas: int = 1, sentinels: int = 3, deadline_s: float = 30.0,
              down_after_ms: int = 1000, service: str = "mymaster", password: str = "") -> "LocalSentinel":
        group = cls(base_dir, service=service, down_after_ms=down_after_ms, password=password)
        Path(base_dir).mkdir(parents=True, exist_ok=True)
        try:
            group.servers.append(_start_answering(group._start_data, Path(base_dir) / "redis0", deadline_s))
            primary = group.servers[0].port
            for i in range(replicas):
                group.servers.append(_start_answering(
                    lambda d: group._start_data(d, "--replicaof", "127.0.0.1", str(primary)),
                    Path(base_dir) / f"redis{i + 1}", deadline_s))
            for i in range(sentinels):
                group.sentinels.append(_start_answering(
                    lambda d: group._start_sentinel(d, primary, quorum=sentinels // 2 + 1),
                    Path(base_dir) / f"sentinel{i}", deadline_s))
            group.wait_ready(deadline_s)
        except BaseException:
            group.stop()
            raise
        return group

    def _start_data(self, directory: Path, *extra: str, port: int | None = None) -> Server:
        """A data server; with a password, from a configuration file (mode 0600) that holds it."""
        config = None
        if self.password:
            directory.mkdir(parents=True, exist_ok=True)
            config = directory / "auth.conf"
            config.touch(mode=0o600)
            config.write_text(f"requirepass {_conf_quote(self.password)}\nmasterauth {_conf_quote(self.password)}\n")
        server = _start_redis(directory, *extra, port=port, config=config)
        server.secured = bool(self.password)
        return server

    def _start_sentinel(self, directory: Path, primary: int, quorum: int) -> Server:
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        conf = directory / "sentinel.conf"  # Sentinel rewrites it: its own copy, writable
        conf.touch(mode=0o600)
        conf.write_text(SENTINEL_CONF.format(port=port, dir=directory, service=self.service, primary=primary,
                                             quorum=quorum, down_after_ms=self.down_after_ms,
                                             failover_timeout_ms=max(3000, 4 * self.down_after_ms))
                        + (f"sentinel auth-pass {self.service} {_conf_quote(self.password)}\n"
                           if self.password else ""))
        log = directory / "sentinel.log"
        pid = _spawn(["redis-server", str(conf), "--sentinel"], log)
        return Server("redis", port, pid, str(log))

    def sentinel_view(self, i: int) -> dict[str, str]:
        """``SENTINEL MASTER <service>`` as Sentinel ``i`` answers it ({} when it does not)."""
        import redis

        try:
            raw = redis.Redis(port=self.sentinels[i].port, socket_timeout=1, socket_connect_timeout=1,
                              decode_responses=True).execute_command("SENTINEL MASTER", self.service)
        except redis.RedisError:
            return {}
        if isinstance(raw, dict):
            return {str(k): str(v) for k, v in raw.items()}
        return {str(raw[j]): str(raw[j + 1]) for j in range(0, len(raw) - 1, 2)}

    def wait_ready(self, deadline_s: float = 30.0) -> None:
        """Until every live Sentinel knows the primary, every live replica and every other
        Sentinel, and every live replica's link is up; or ServiceError."""
        end = time.monotonic() + deadline_s
        while True:
            live = [s for s in self.servers if _pid_alive(s.pid)]
            want = (len(live) - 1, len(self.sentinels) - 1)
            views = [self.sentinel_view(i) for i in range(len(self.sentinels))]
            if all(v.get("flags") == "master" and (int(v.get("num-slaves", -1)), int(v.get("num-other-sentinels", -1)))
                   >= want for v in views) and all(_replica_synced(s.port, self.password) for s in live):
                return
            if time.monotonic() > end:
                raise ServiceError(f"the Sentinels did not see the primary, {want[0]} replica(s) and each other "
                                   f"within {deadline_s:.0f} s: {views}")
            time.sleep(0.1)

    def primary(self) -> int | None:
        """The index in ``servers`` of the primary a majority of the Sentinels name, or None."""
        named = [v.get("port") for v in (self.sentinel_view(i) for i in range(len(self.sentinels)))]
        for j, s in enumerate(self.servers):
            if named.count(str(s.port)) > len(self.sentinels) // 2:
                return j
        return None

    def kill(self, i: int) -> None:
        """SIGKILL data server ``i`` by PID and wait (bounded) until it is gone."""
        _kill_pid(self.servers[i].pid)

    def start_again(self, i: int, deadline_s: float = 30.0) -> None:
        """Start data server ``i`` again on its port and data directory (as it was first started:
        a former primary starts as a primary; the Sentinels then make it a replica)."""
        old = self.servers[i]
        extra = () if i == 0 else ("--replicaof", "127.0.0.1", str(self.servers[0].port))
        self.servers[i] = self._start_data(Path(old.log).parent, *extra, port=old.port)
        _wait_answering(self.servers[i], deadline_s)

    def stop(self, deadline_s: float = 10.0) -> None:
        for s in [*self.sentinels, *self.servers]:
            _stop_pid(s.pid, deadline_s)

    def logs(self) -> str:
        return "\n".join(f"--- {Path(s.log).parent.name} ({s.log}) ---\n{_log_tail(s.log, 15)}"
                         for s in [*self.servers, *self.sentinels])


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
        return _start_zookeeper(Path(self.base_dir) / f"zk{i + 1}", port=port, quorum=self.quorum, myid=i + 1)

    def mode(self, i: int) -> str | None:
        """``leader``, ``follower``, or None while member ``i`` serves no clients."""
        reply = _reply(self.servers[i].port, b"srvr").decode(errors="replace")
        for line in reply.splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None

    def leader(self) -> int | None:
        return next((i for i in range(len(self.servers)) if self.mode(i) == "leader"), None)

    def wait_serving(self, deadline_s: float) -> None:
        """Until every live member serves and one of them leads, or ServiceError."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            modes = [self.mode(i) for i in range(len(self.servers)) if _pid_alive(self.servers[i].pid)]
            if modes and None not in modes and "leader" in modes:
                return
            time.sleep(0.1)
        raise ServiceError(f"the ZooKeeper ensemble did not elect a leader within {deadline_s:.0f} s:\n"
                           + "\n".join(_log_tail(s.log, 10) for s in self.servers))

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and wait (bounded) until it is gone."""
        pid = self.servers[i].pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        end = time.monotonic() + 10.0
        while time.monotonic() < end and _pid_alive(pid):
            time.sleep(0.02)

    def start_again(self, i: int, deadline_s: float = 60.0) -> None:
        """Start member ``i`` again on its ports and data; wait until the ensemble serves."""
        self.servers[i] = self._start_member(i, self.servers[i].port)
        self.wait_serving(deadline_s)

    def stop(self, deadline_s: float = 10.0) -> None:
        for s in self.servers:
            _stop_pid(s.pid, deadline_s)


def _replica_synced(port: int, password: str = "") -> bool:
    """True for a primary, and for a replica whose link to its primary is up."""
    auth = b""
    if password:
        pw = password.encode()
        auth = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)
    info = _reply(port, auth + b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n")
    return b"role:master" in info or b"master_link_status:up" in info


def _kill_pid(pid: int, deadline_s: float = 10.0) -> None:
    """SIGKILL ``pid`` and wait (bounded) until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and _pid_alive(pid):
        time.sleep(0.02)


def _cluster_ok(port: int) -> bool:
    return b"cluster_state:ok" in _reply(port, b"*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n")


def _reply(port: int, request: bytes, timeout: float = 0.5) -> bytes:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request)
            return sock.recv(65536)
    except OSError:
        return b""


def _start_zookeeper(directory: Path, port: int | None = None, quorum: str = "", myid: int | None = None) -> Server:
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
    cfg.write_text(ZOO_CFG.format(data_dir=data, port=port) + quorum)
    log = directory / "zookeeper.log"
    pid = _spawn(
        ["java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
         "-Dzookeeper.log.dir=" + str(directory), "-cp", ZK_CLASSPATH,
         "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
        log,
    )
    return Server("zookeeper", port, pid, str(log))


class _PortTaken(ServiceError):
    """The port picked for a server was bound by someone else before it started."""


# How many ports a start tries: a port free when picked can be taken by any
# outgoing connection on the machine (both come from the ephemeral range)
# before a JVM that takes a second to start binds it.
PORT_ATTEMPTS = 5


def _start_answering(start: Callable[[Path], Server], directory: Path, deadline_s: float) -> Server:
    """Start a server and wait until it answers, on a fresh port when the picked one was taken."""
    for attempt in range(PORT_ATTEMPTS):
        server = start(directory)
        try:
            _wait_answering(server, deadline_s)
            return server
        except _PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
            # Keep the failed start's log for a reader, out of the next one's way.
            Path(server.log).replace(f"{server.log}.port-{server.port}")
    raise AssertionError("unreachable")


def _wait_answering(server: Server, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if server.answers():
            return
        if not _pid_alive(server.pid):
            log = _log_tail(server.log)
            error = _PortTaken if "Address already in use" in log else ServiceError
            raise error(f"{server.name} exited during start-up; log:\n{log}")
        time.sleep(0.05)
    raise ServiceError(
        f"{server.name} on 127.0.0.1:{server.port} did not answer within {deadline_s:.0f} s; "
        f"log:\n{_log_tail(server.log)}"
    )


def _stop_pid(pid: int, deadline_s: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and _pid_alive(pid):
        time.sleep(0.05)
    if _pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
