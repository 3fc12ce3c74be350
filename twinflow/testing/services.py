"""Local Redis and ZooKeeper for development, tests and the demo.

``LocalServices.start()`` runs a real ``redis-server`` and a real standalone
ZooKeeper (Debian's packages) on free loopback ports with temporary data
directories, waits until each answers, and ``stop()`` ends them by PID. The
state (PIDs, ports, directories) can be saved to a JSON file so that
``twinflow services up`` can return while the servers keep running and
``twinflow services down`` can stop them later.

Under failure: a server that exits or does not answer before its deadline
raises :class:`~.servers.ServiceError` carrying the tail of its log, and
whatever was already started is stopped (see :mod:`.servers`). ``stop()``
never raises for a server that is already gone.

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
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..services_state import redis_url, zk_hosts
from .servers import (Server, ServiceError, conf_quote, log_tail, pid_alive, start_answering, start_redis,
                      start_zookeeper, stop_pid, wait_answering)

__all__ = ["LocalServices", "LocalRedis", "RedisTls", "ServiceError"]


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
        return redis_url(self.redis.port)

    @property
    def zk_hosts(self) -> str:
        return zk_hosts(self.zookeeper.port)

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
                svc.servers.append(start_answering(start_redis, Path(base) / "redis", deadline_s))
            if zookeeper:
                svc.servers.append(start_answering(start_zookeeper, Path(base) / "zookeeper", deadline_s))
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
                "alive": pid_alive(s.pid),
                "answers": s.answers(),
                "log": s.log,
            }
            for s in self.servers
        }

    def stop(self, deadline_s: float = 10.0) -> None:
        """Stop every server by PID (TERM, then KILL after the deadline)."""
        for s in self.servers:
            stop_pid(s.pid, deadline_s)
        if self.owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def stop_redis(self, deadline_s: float = 10.0) -> None:
        """Stop Redis by PID (TERM: it writes its append-only file first)."""
        stop_pid(self.redis.pid, deadline_s)

    def start_redis_again(self, deadline_s: float = 30.0) -> None:
        """Start Redis again on its port and data directory (it reloads its append-only file)."""
        old = self.redis
        server = start_redis(Path(old.log).parent, port=old.port)
        self.servers[self.servers.index(old)] = server
        wait_answering(server, deadline_s)

    def logs(self) -> str:
        """The tail of every server's log, for a failing test or command."""
        return "\n".join(f"--- {s.name} ({s.log}) ---\n{log_tail(s.log)}" for s in self.servers)

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LocalServices":
        raw = json.loads(Path(path).read_text())
        raw["servers"] = [Server(**s) for s in raw["servers"]]
        return cls(**raw)


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
    ``ps`` shows it. :attr:`url` names no password, as a peer is given it.
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
            server = start_redis(d, config=config, tls=tls is not None)
            server.secured = bool(password)
            if tls:
                server.tls_ca, server.tls_cert, server.tls_key = tls.ca_file, tls.client_cert, tls.client_key
            return server

        try:
            local.server = start_answering(start, directory, deadline_s)
        except BaseException:
            local.stop()
            raise
        return local

    def _config(self) -> str:
        lines = []
        if self.user:
            # Only the ACL user gets in: a client without a user name is refused.
            lines += ["user default off", f"user {self.user} on {conf_quote('>' + self.password)} ~* &* +@all"]
        elif self.password:
            lines.append(f"requirepass {conf_quote(self.password)}")
        if self.tls:
            lines += [f"tls-cert-file {conf_quote(self.tls.cert_file)}",
                      f"tls-key-file {conf_quote(self.tls.key_file)}",
                      f"tls-ca-cert-file {conf_quote(self.tls.ca_file)}",
                      f"tls-auth-clients {'yes' if self.tls.auth_clients else 'no'}"]
        return "".join(f"{line}\n" for line in lines)

    def stop(self, deadline_s: float = 10.0) -> None:
        """Stop the server by PID (TERM, then KILL after the deadline); never raises for one that is gone."""
        if self.server is not None:
            stop_pid(self.server.pid, deadline_s)

    def logs(self) -> str:
        return "" if self.server is None else f"--- redis ({self.server.log}) ---\n{log_tail(self.server.log)}"
