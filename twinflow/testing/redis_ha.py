"""Redis with replicas on loopback, for tests and the Redis failover drills: a Redis Cluster
(:class:`LocalRedisCluster`) and a Sentinel group (:class:`LocalSentinel`).

Every server is a real ``redis-server`` started and stopped by PID (see :mod:`.servers`).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .servers import (Server, ServiceError, conf_quote, free_port, kill_pid, log_tail, pid_alive, replica_synced,
                      server_reply, cluster_ok, spawn, start_answering, start_redis, stop_pid, wait_answering)


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
    replicas: int = 0         # per primary, as started: wait_ok waits until each primary lists them

    @property
    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{s.port}/0" for s in self.servers]

    @classmethod
    def start(cls, base_dir: str, n: int = 3, deadline_s: float = 30.0, replicas: int = 0,
              node_timeout_ms: int = 2000) -> "LocalRedisCluster":
        cluster = cls(base_dir, node_timeout_ms=node_timeout_ms, replicas=replicas)
        try:
            for i in range(n * (1 + replicas)):
                # The bus port explicitly: the default (port + 10000) fails above port 55535.
                cluster.bus_ports.append(free_port())
                cluster.servers.append(start_answering(lambda d, i=i: cluster._start_node(d, i),
                                                        Path(base_dir) / f"node{i}", deadline_s))
            addrs = [f"127.0.0.1:{s.port}" for s in cluster.servers]
            done = subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", str(replicas),
                                   "--cluster-yes"], capture_output=True, text=True, timeout=deadline_s)
            if done.returncode != 0:
                raise ServiceError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            cluster.wait_ok(deadline_s, replicas_listed=True)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_node(self, directory: Path, i: int, port: int | None = None) -> Server:
        return start_redis(directory, "--cluster-enabled", "yes", "--cluster-node-timeout", str(self.node_timeout_ms),
                            "--cluster-config-file", str(directory / "nodes.conf"),
                            "--cluster-port", str(self.bus_ports[i]), port=port)

    def wait_ok(self, deadline_s: float = 30.0, replicas_listed: bool = False) -> None:
        """Until every live node says cluster_state:ok, every live replica's link to its primary
        is up and, with ``replicas_listed`` (at start), every primary lists its replicas in its own
        CLUSTER NODES (it learns them by gossip, later than they link up), or ServiceError."""
        end = time.monotonic() + deadline_s
        while True:
            live = [s for s in self.servers if pid_alive(s.pid)]
            if all(cluster_ok(s.port) for s in live) and all(replica_synced(s.port) for s in live) \
                    and (not replicas_listed or self._primaries_know_their_replicas()):
                return
            if time.monotonic() > end:
                raise ServiceError(f"the Redis Cluster did not reach cluster_state:ok within {deadline_s:.0f} s")
            time.sleep(0.05)

    def _primaries_know_their_replicas(self) -> bool:
        """Every live primary that serves slots lists ``replicas`` replicas in its own view."""
        for i, server in enumerate(self.servers):
            if not pid_alive(server.pid):
                continue
            raw = server_reply(server.port, b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nNODES\r\n").decode(errors="replace")
            mine = [line.split() for line in raw.splitlines()[1:] if "myself" in line]
            if not mine:
                return False
            me = mine[0]
            if "master" in me[2].split(",") and len(me) > 8 and len(self.replicas_of(i)) < self.replicas:
                return False
        return True

    def owner(self, key: str) -> int:
        """The index in ``servers`` of the primary that serves ``key``'s slot, as a live node says."""
        import redis

        for s in self.servers:
            if not pid_alive(s.pid):
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
        raw = server_reply(self.servers[i].port, b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nNODES\r\n").decode(errors="replace")
        lines = [line.split() for line in raw.splitlines()[1:] if len(line.split()) >= 8]
        me = next(f[0] for f in lines if "myself" in f[2].split(","))
        ports = {int(f[1].split("@")[0].rsplit(":", 1)[1]) for f in lines
                 if f[3] == me and "slave" in f[2].split(",") and "fail" not in f[2].split(",")}
        return [j for j, s in enumerate(self.servers) if s.port in ports and pid_alive(s.pid)]

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` by PID and wait (bounded) until it is gone."""
        kill_pid(self.servers[i].pid)

    def start_again(self, i: int, deadline_s: float = 30.0) -> None:
        """Start node ``i`` again on its ports and data directory; wait until it answers."""
        old = self.servers[i]
        self.servers[i] = self._start_node(Path(old.log).parent, i, port=old.port)
        wait_answering(self.servers[i], deadline_s)

    def takeover(self, i: int) -> None:
        """``CLUSTER FAILOVER TAKEOVER`` on replica ``i``: it takes its primary's slots now."""
        import redis

        redis.Redis(port=self.servers[i].port, socket_timeout=5).execute_command("CLUSTER FAILOVER", "TAKEOVER")

    def stop(self, deadline_s: float = 10.0) -> None:
        for s in self.servers:
            stop_pid(s.pid, deadline_s)


SENTINEL_CONF = """\
port {port}
bind {bind}
daemonize no
dir {dir}
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor {service} {primary_host} {primary} {quorum}
sentinel down-after-milliseconds {service} {down_after_ms}
sentinel failover-timeout {service} {failover_timeout_ms}
sentinel parallel-syncs {service} 1
"""


@dataclass
class LocalSentinel:
    """A Redis primary, ``replicas`` replicas and ``sentinels`` Sentinels on loopback, owned by
    this object: Redis high availability with Sentinel, for tests and the ``redis-failover`` drill.

    Each server is a real ``redis-server`` (a Sentinel is ``redis-server sentinel.conf
    --sentinel``). :attr:`url` is the ``redis+sentinel://`` URL a peer is given.
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
        """The URL a peer is given (no password in it: the password goes in TWINFLOW_REDIS_PASSWORD)."""
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.service}/0"

    @classmethod
    def start(cls, base_dir: str, replicas: int = 1, sentinels: int = 3, deadline_s: float = 30.0,
              down_after_ms: int = 1000, service: str = "mymaster", password: str = "") -> "LocalSentinel":
        group = cls(base_dir, service=service, down_after_ms=down_after_ms, password=password)
        Path(base_dir).mkdir(parents=True, exist_ok=True)
        try:
            group.servers.append(start_answering(group._start_data, Path(base_dir) / "redis0", deadline_s))
            primary = group.servers[0].port
            for i in range(replicas):
                group.servers.append(start_answering(
                    lambda d: group._start_data(d, "--replicaof", "127.0.0.1", str(primary)),
                    Path(base_dir) / f"redis{i + 1}", deadline_s))
            for i in range(sentinels):
                group.sentinels.append(start_answering(
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
            config.write_text(f"requirepass {conf_quote(self.password)}\nmasterauth {conf_quote(self.password)}\n")
        server = start_redis(directory, *extra, port=port, config=config)
        server.secured = bool(self.password)
        return server

    def _start_sentinel(self, directory: Path, primary: int, quorum: int) -> Server:
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        conf = directory / "sentinel.conf"  # Sentinel rewrites it: its own copy, writable
        conf.touch(mode=0o600)
        conf.write_text(SENTINEL_CONF.format(port=port, bind="127.0.0.1", dir=directory, service=self.service,
                                             primary_host="127.0.0.1", primary=primary,
                                             quorum=quorum, down_after_ms=self.down_after_ms,
                                             failover_timeout_ms=max(3000, 4 * self.down_after_ms))
                        + (f"sentinel auth-pass {self.service} {conf_quote(self.password)}\n"
                           if self.password else ""))
        log = directory / "sentinel.log"
        pid = spawn(["redis-server", str(conf), "--sentinel"], log)
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
            live = [s for s in self.servers if pid_alive(s.pid)]
            want = (len(live) - 1, len(self.sentinels) - 1)
            views = [self.sentinel_view(i) for i in range(len(self.sentinels))]
            if all(v.get("flags") == "master" and (int(v.get("num-slaves", -1)), int(v.get("num-other-sentinels", -1)))
                   >= want for v in views) and all(replica_synced(s.port, self.password) for s in live):
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
        kill_pid(self.servers[i].pid)

    def start_again(self, i: int, deadline_s: float = 30.0) -> None:
        """Start data server ``i`` again on its port and data directory (as it was first started:
        a former primary starts as a primary; the Sentinels then make it a replica)."""
        old = self.servers[i]
        extra = () if i == 0 else ("--replicaof", "127.0.0.1", str(self.servers[0].port))
        self.servers[i] = self._start_data(Path(old.log).parent, *extra, port=old.port)
        wait_answering(self.servers[i], deadline_s)

    def stop(self, deadline_s: float = 10.0) -> None:
        for s in [*self.sentinels, *self.servers]:
            stop_pid(s.pid, deadline_s)

    def logs(self) -> str:
        return "\n".join(f"--- {Path(s.log).parent.name} ({s.log}) ---\n{log_tail(s.log, 15)}"
                         for s in [*self.servers, *self.sentinels])
