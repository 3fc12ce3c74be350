"""Whether the guide lab's servers answer, and the flow's Redis as the Sentinels name it (mixed
into :class:`~.guide_lab.GuideLab`): a ``serve`` line of the guide started as the server it
runs (:data:`SERVER_NAMES`), each server asked as an operator would from host-c (Redis and
Sentinel ping, ZooKeeper's mode, Prometheus scraping every peer, the Spark master ALIVE with
each worker), the Sentinels agreeing on the primary and its replicas, a client on the primary
the Sentinels name, and the flow's keys deleted from it (the state an operator lost).

The lab gives ``host()``, ``state``, ``directory``, ``on_host()``, ``secrets()``,
``peer_ids()``, ``peer_of()``, ``peer_statuses()``, ``spark_state()`` and its waits.

Under failure: a server that does not answer reads as not answering (False, or no targets),
never as an error; a wait for servers raises :class:`~.lab.LabError` with their logs once its
deadline passes or one of them exits. A read of the flow's Redis waits out a Sentinel failover
for up to ``REDIS_FAILOVER_S``, then raises what the last try raised; no Sentinel naming a
primary raises :class:`~.lab.LabError`; a ``serve`` line the lab cannot name raises
:class:`~.guide_blocks.GuideError`.
"""

from __future__ import annotations

import http.client
import json
import shlex
import time
from typing import Callable

import redis

from .guide_blocks import GuideError
from .guide_hosts import HOSTS, REDIS_FAILOVER_S
from .lab import LabError, _NetnsHttp, redis_in
from .lab_hosts import Launch, base_env
from .lab_network import LabProcess

SERVICE = "twinflow"  # the Sentinels' name for the primary (the guide's sentinel.conf)
# The servers of a `serve` line, by what the line runs.
SERVER_NAMES = (("--sentinel", "sentinel"), ("redis.conf", "redis"), ("QuorumPeerMain", "zookeeper"),
                ("deploy.master.Master", "spark-master"), ("deploy.worker.Worker", "spark-worker"))


class GuideServers:
    """The guide's servers asked whether they answer, and the flow's Redis (see module)."""

    def _server_launch(self, host: str, line: str) -> Launch:
        name = next((n for marker, n in SERVER_NAMES if marker in line), None)
        if name is None:
            raise GuideError(f"a serve line the lab cannot name: {line}")
        port = {"redis": 6379, "sentinel": 26379, "zookeeper": 2181, "spark-master": 7077,
                "spark-worker": 8081}[name]
        d = self.directory / "hosts" / host / name
        return Launch(host, name, self.on_host(host, shlex.split(line)), base_env(), str(d), str(d / f"{name}.log"),
                      port)

    def answers(self, p: LabProcess) -> bool:
        address = self.state.host(p.host).address
        try:
            if p.name in ("redis", "sentinel"):
                client = redis_in(self.client_ns, address, p.port,
                                  self.secrets()["password"] if p.name == "redis" else None)
                try:
                    return bool(client.ping())
                finally:
                    client.close()
            if p.name == "zookeeper":
                return self._zk_mode(address) in ("leader", "follower")
            if p.name == "prometheus":
                targets = self.prometheus_targets(address)
                return len(targets) >= len(self.peer_ids()) and all(t == "up" for t in targets.values())
            if p.name == "spark-master":
                return (self.spark_state() or {}).get("status") == "ALIVE"
            if p.name == "spark-worker":
                return any(w.get("host") == f"{p.host}.example" and w.get("state") == "ALIVE"
                           for w in (self.spark_state() or {}).get("workers", []))
            if self.peer_of(p) is not None:
                return self.peer_statuses().get(self.peer_of(p), {}).get("pid") == str(p.pid)
        except (OSError, redis.RedisError):
            return False
        return False

    def _wait_servers(self, servers: list[LabProcess], end: float) -> None:
        for p in servers:
            self._wait(f"{p.name} answering on {p.host}", lambda p=p: self.answers(p), end, servers)
        if any(p.name == "sentinel" for p in servers) and len(self.hosts_running("redis-sentinel")) >= 3:
            self._wait("the Sentinels agreeing on the primary and its replicas", self._sentinels_ready, end, servers)

    def _spark_address(self) -> str:
        return self.state.host("host-c").address

    def prometheus_targets(self, address: str | None = None) -> dict[str, str]:
        """The Prometheus on host-c: each target of its ``twinflow`` job -> its health ("up",
        "down", "unknown"); {} when it does not answer."""
        conn = _NetnsHttp(self.client_ns, address or self.state.host("host-c").address, 9090, 2.0)
        try:
            conn.request("GET", "/api/v1/targets?state=active")
            data = json.loads(conn.getresponse().read())
        except (OSError, ValueError, http.client.HTTPException):
            return {}
        finally:
            conn.close()
        return {t["labels"].get("instance", ""): t.get("health", "")
                for t in data.get("data", {}).get("activeTargets", []) if t.get("labels", {}).get("job") == "twinflow"}

    def zk_mode_of(self, host: str) -> str | None:
        """The mode of ``host``'s ZooKeeper server (None when none answers)."""
        try:
            return self._zk_mode(self.state.host(host).address)
        except OSError:
            return None

    def hosts_running(self, unit: str) -> list[str]:
        """The hosts with ``unit`` enabled."""
        return [h for h, units in self.state.info.get("enabled", {}).items() if unit in units]

    def _sentinels_ready(self) -> bool:
        replicas = len(self.hosts_running("redis-server")) - 1
        return all(self._sentinel_agrees(self.state.host(name).address, 26379, SERVICE, replicas=replicas)
                   for name in self.hosts_running("redis-sentinel"))

    def address_of(self, name: str) -> str:
        """A lab host's address by any of its names (``host-a.example``, ``host-a``, an address)."""
        short = name.split(".", 1)[0]
        return self.state.host(short).address if short in HOSTS else name

    def _on_redis(self, read: Callable):
        """A read of the flow's Redis, waiting out a Sentinel failover (the primary's machine
        killed: until the Sentinels name another, the one they name refuses connections)."""
        end = time.monotonic() + REDIS_FAILOVER_S
        while True:
            try:
                return super()._on_redis(read)
            except (OSError, redis.ConnectionError, redis.TimeoutError, LabError):
                if time.monotonic() > end:
                    raise
                time.sleep(0.5)

    def redis(self) -> redis.Redis:
        """A client on the primary the Sentinels name (asked from host-c), made in host-c."""
        for name in ("host-c", "host-b", "host-a"):
            sentinel = redis_in(self.client_ns, self.state.host(name).address, 26379, decode_responses=True)
            try:
                named = sentinel.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)
            except (OSError, redis.RedisError):
                continue
            finally:
                sentinel.close()
            if named:
                return redis_in(self.client_ns, self.address_of(named[0]), int(named[1]), self.secrets()["password"])
        raise LabError(f"no Sentinel names a primary for {SERVICE}")

    def forget_flow(self) -> int:
        """Delete every key of the lab's flow from its Redis primary (the state an operator
        lost); how many there were."""
        client = self.redis()
        try:
            keys = list(client.scan_iter(match=f"tf:{{{self.plan.flow}}}*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i:i + 500])
            return len(keys)
        finally:
            client.close()
