"""One local cluster: N ``twinflow run`` nodes of one flow on real servers, for the tests, the
demo, the benches and the drills; with ``proxied`` every link goes through the fault proxy.

:meth:`LocalCluster.start` starts a real Redis and ZooKeeper (``LocalServices``,
or the caller's ``services``, which it then leaves running), and, unless
``nodes=False``, the node processes. Nodes are named ``node-a``, ``node-b``, ...
(``nodes=3``) or as given (``nodes=("a", "b")``).

With ``proxied=True`` the Toxiproxy-compatible fault proxy (``twinflow proxy``,
its own process) sits on every link, each link with a proxy of its own, so a
drill can fault exactly one:

==================  ============================================
proxy               link
==================  ============================================
``redis-<node>``    that node to Redis
``zk-<node>``       that node to ZooKeeper (``zk-<node>-<i>`` to
                    member i of an ensemble)
``grpc-<node>``     escalations (and handovers) into that node
``producer``        the producer to the uplink
==================  ============================================

Each node then listens for gRPC on a port picked here and advertises its
proxy's address, so the master's escalations to the worker pass through
``grpc-<worker>``.

With ``redis_mode="sentinel"`` the nodes are given a ``redis+sentinel://``
URL (a primary, two replicas and three Sentinels,
:class:`~twinflow.testing.redis_ha.LocalSentinel`), with ``"cluster"`` the URL
of the node that owns the flow's slot on a three-primary Redis Cluster with a
replica each (:class:`~twinflow.testing.redis_ha.LocalRedisCluster`): no proxy
sits on their Redis links, so that a failover is theirs to follow. The
producer and the checker then follow the primary too (``redis_slot.relocate``);
with ``wait_replicas`` the producer's XADDs wait for that many replicas
(``WAIT``), as a producer that must not lose an acknowledged message does.

With ``zk_members=3`` the cluster runs on a three-server ZooKeeper
ensemble (:class:`~twinflow.testing.zk_ensemble.LocalZkEnsemble`) and each
node's connect string names all three members (each through its own proxy).

Everything it started is stopped by PID in :meth:`stop`, also after an error.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from ..runtime.flowgraph import load_graph
from ..runtime.store.flow_keys import FlowKeys
from ..runtime.waiting import wait_for
from .checker import read_outputs, read_sequences
from .processes import NodeProcess
from .producers import Producing
from .redis_ha import LocalRedisCluster, LocalSentinel
from .servers import free_port
from .services import LocalServices
from .zk_ensemble import LocalZkEnsemble

# The claim pair alone (an action and the sort that pairs with it): the flow when none is given.
CLAIM_PAIR = """\
flow: {name}
uplink: {{stream: uplink}}
message: {{id: id, id_ttl: 86400}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
  sort: {{type: sort, pairs_with: deliver, key: seq, key_type: int, bake_time: {bake_time}, unclaimed_outlink: done}}
cluster: {{session_timeout: 2.0}}
"""


class LocalCluster(Producing):
    def __init__(self, workdir: str | None = None, flow: str = "demo", text: str | None = None,
                 nodes: int | Sequence[str] = 2, services: LocalServices | None = None, bake_time: float = 5.0,
                 proxied: bool = False, zk_members: int = 1, redis_mode: str = "single", wait_replicas: int = 0):
        """``text``: the flow file to run (its ``flow:`` is replaced by ``flow``); default the claim pair."""
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="twinflow-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flow = flow
        self.flow_path = self.workdir / "flow.yaml"
        text = CLAIM_PAIR.format(name=flow, bake_time=bake_time) if text is None else text
        self.flow_path.write_text(re.sub(r"(?m)^flow: .*$", f"flow: {flow}", text, count=1))
        self.graph = load_graph(self.flow_path)
        self.keys = FlowKeys(flow, self.graph.cluster.uplink_stream)
        self.sink_key, self.failure_key = self.keys.sink, self.keys.failure
        self.node_ids = ([f"node-{chr(ord('a') + i)}" for i in range(nodes)] if isinstance(nodes, int)
                         else list(nodes))
        self.services = services
        self.owns_services = services is None
        self.proxied = proxied
        self.zk_members = zk_members
        self.ensemble: LocalZkEnsemble | None = None
        self.proxy_proc: subprocess.Popen | None = None
        self.toxiproxy = None
        self.proxies: dict = {}
        self.nodes: dict[str, NodeProcess] = {}
        self.redis: redis.Redis | None = None    # direct, for the checker
        self.producer: redis.Redis | None = None  # through the producer's proxy when proxied
        self.redis_mode = redis_mode              # single, sentinel or cluster (see module)
        self.wait_replicas = wait_replicas        # the producer's WAIT (HA modes)
        self.ha: LocalSentinel | LocalRedisCluster | None = None
        self.redis_url = ""                       # what the nodes are given

    # -- life cycle -------------------------------------------------------
    def start(self, nodes: bool = True) -> "LocalCluster":
        """Start the servers (and the fault proxy), and the node processes unless ``nodes`` is False
        (:meth:`start_nodes` starts them later)."""
        try:
            single = self.redis_mode == "single"
            if self.owns_services:
                self.services = LocalServices.start(base_dir=str(self.workdir / "services"), deadline_s=30,
                                                    zookeeper=self.zk_members == 1, redis=single)
            if self.zk_members > 1:
                self.ensemble = LocalZkEnsemble.start(str(self.workdir / "ensemble"), self.zk_members)
            if single:
                self.redis_url = self.services.redis_url
                self.redis = redis.Redis.from_url(self.redis_url)
                self.producer = self.redis
            else:
                self._start_ha()
            if self.proxied:
                self._start_proxy()
            for node_id in self.node_ids:
                self.nodes[node_id] = self._node(node_id, single)
            if single and self.proxied:
                producer = self._proxy("producer", f"127.0.0.1:{self.services.redis.port}")
                self.producer = redis.Redis.from_url(f"redis://{producer.listen}/0", socket_timeout=10)
            if nodes:
                self.start_nodes()
            return self
        except BaseException:
            self.stop()
            raise

    def _node(self, node_id: str, single: bool) -> NodeProcess:
        """The node's process (not started), its links through their proxies when proxied."""
        zk_members = [f"127.0.0.1:{m.port}" for m in self.ensemble.servers] if self.ensemble else []
        node_redis, zk, extra = self.redis_url, self.zk_hosts, []
        if self.proxied:
            if single:
                node_redis = f"redis://{self._proxy(f'redis-{node_id}', f'127.0.0.1:{self.services.redis.port}').listen}/0"
            if self.ensemble is None:
                zk = self._proxy(f"zk-{node_id}", self.services.zk_hosts).listen
            else:
                zk = ",".join(self._proxy(f"zk-{node_id}-{i + 1}", member).listen
                              for i, member in enumerate(zk_members))
            grpc_port = free_port()
            grpc = self._proxy(f"grpc-{node_id}", f"127.0.0.1:{grpc_port}")
            extra = ["--listen", f"127.0.0.1:{grpc_port}", "--advertise", grpc.listen]
        return NodeProcess(node_id, str(self.flow_path), node_redis, zk, str(self.workdir / "state"),
                           str(self.workdir / f"{node_id}.log"), extra_args=extra)

    def start_nodes(self) -> None:
        for node in self.nodes.values():
            node.start()

    def _start_ha(self) -> None:
        """A Sentinel group or a Redis Cluster with replicas; the checker's and producer's clients."""
        if self.redis_mode == "sentinel":
            self.ha = LocalSentinel.start(str(self.workdir / "redis-sentinel"), replicas=2, sentinels=3)
            self.redis_url = self.ha.url
        elif self.redis_mode == "cluster":
            self.ha = LocalRedisCluster.start(str(self.workdir / "redis-cluster"), n=3, replicas=1,
                                              node_timeout_ms=1000)
            # The node that owns the flow's slot: the one the drill kills (the URL's node dies).
            self.redis_url = self.ha.urls[self.ha.owner(self.keys.uplink)]
        else:
            raise ValueError(f"unknown redis_mode {self.redis_mode!r} (single, sentinel, cluster)")
        self.redis = self._ha_client()
        self.producer = self._ha_client()

    def _ha_client(self) -> redis.Redis:
        from ..runtime.store.redis_slot import client_from_url

        return client_from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=1,
                               slot_key=self.keys.uplink)

    def _on_ha(self, which: str, call, deadline_s: float = 30.0):
        """``call(client)`` on the checker's or producer's client (``which``), following a Redis
        failover: on a connection error the client looks for the primary again; retried up to the
        deadline."""
        from ..runtime.store.flow_store import transient
        from ..runtime.store.redis_slot import follow_moved, relocate

        end = time.monotonic() + deadline_s
        while True:
            client = getattr(self, which)
            try:
                return call(client)
            except redis.exceptions.MovedError as moved:
                setattr(self, which, follow_moved(client, moved))
            except (redis.ConnectionError, redis.TimeoutError):
                try:
                    setattr(self, which, relocate(client))
                except redis.RedisError:
                    pass
            except redis.RedisError as exc:
                if not transient(exc):
                    raise
            if time.monotonic() > end:
                raise RuntimeError(f"Redis did not answer the drill's {which} within {deadline_s:.0f} s")
            time.sleep(0.1)

    def _start_proxy(self) -> None:
        from toxiproxy import Toxiproxy

        self.proxy_proc = subprocess.Popen([sys.executable, "-m", "twinflow.cli", "proxy", "--port", "0"],
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proxy_proc.stdout.readline()
        if "Toxiproxy API on" not in line:
            raise RuntimeError(f"the fault proxy did not start: {line!r}")
        self.toxiproxy = Toxiproxy()
        self.toxiproxy.update_api_consumer("127.0.0.1", int(line.rsplit(":", 1)[1]))

    def _proxy(self, name: str, upstream: str):
        self.proxies[name] = self.toxiproxy.create(upstream=upstream, name=name)
        return self.proxies[name]

    def stop(self) -> None:
        """Stop the nodes (SIGTERM: a graceful handover), the proxy and the servers this cluster started."""
        for node in self.nodes.values():
            if node.proc is not None and node.alive():
                node.cont()
                node.terminate(deadline_s=15)
        if self.proxy_proc is not None:
            self.proxy_proc.terminate()
            try:
                self.proxy_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proxy_proc.kill()
        if self.services is not None and self.owns_services:
            self.services.stop()
        if self.ensemble is not None:
            self.ensemble.stop()
        if self.ha is not None:
            self.ha.stop()

    @property
    def zk_hosts(self) -> str:
        """ZooKeeper's own address(es), not through any proxy."""
        return self.ensemble.hosts if self.ensemble is not None else self.services.zk_hosts

    def remove(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- looking ----------------------------------------------------------
    def status(self, node_id: str) -> dict:
        """The node's status hash in Redis ({} when it has none)."""
        if self.ha is not None:
            raw = self._on_ha("redis", lambda r: r.hgetall(self.keys.node(node_id)))
        else:
            raw = self.redis.hgetall(self.keys.node(node_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def master(self) -> str | None:
        for node_id, node in self.nodes.items():
            if node.alive() and self.status(node_id).get("role") == "master":
                return node_id
        return None

    def other(self, node_id: str) -> str:
        return next(n for n in self.node_ids if n != node_id)

    def statuses(self) -> dict[str, dict]:
        """Each node's status hash, for the nodes that have one."""
        return {n: st for n in self.nodes if (st := self.status(n))}

    def master_epoch(self) -> tuple[str, int] | None:
        """The live master and its epoch, or None."""
        for node_id, st in self.statuses().items():
            if st.get("role") == "master" and self.nodes[node_id].alive():
                return node_id, int(st["epoch"])
        return None

    def live_address(self, avoid: str | None = None) -> str | None:
        """The gRPC address of a live node (other than ``avoid``), for publishing through Ingest."""
        st = self.statuses()
        for node_id, p in self.nodes.items():
            if p.alive() and node_id != avoid and node_id in st:
                return st[node_id]["grpc_address"]
        return None

    def sink_count(self) -> int:
        return self.redis.xlen(self.sink_key)

    def wait_ready(self, timeout_s: float = 120) -> str:
        """Until one node is master and every live node streams; returns the master."""
        def ready():
            live = [n for n, p in self.nodes.items() if p.alive()]
            if any(self.status(n).get("streaming") != "1" for n in live):
                return None
            return self.master()
        master = wait_for(ready, timeout_s, 0.2)
        if master is None:
            raise RuntimeError("the cluster did not become ready:\n" + self.logs())
        return master

    def wait_role(self, node_id: str, role: str, timeout_s: float = 60) -> None:
        if not wait_for(lambda: self.status(node_id).get("role") == role, timeout_s, 0.1):
            raise RuntimeError(f"{node_id} did not become {role} within {timeout_s:.0f} s:\n{self.logs()}")

    def restart(self, node_id: str, timeout_s: float = 120) -> None:
        """Start a stopped node again and wait until this new process streams (the status a
        killed process left in Redis lives on for a few seconds: the PID tells them apart)."""
        node = self.nodes[node_id]
        node.start()
        pid = str(node.pid)
        if not wait_for(lambda: self.status(node_id).get("pid") == pid and self.status(node_id).get("streaming") == "1",
                        timeout_s, 0.2):
            raise RuntimeError(f"{node_id} did not stream again within {timeout_s:.0f} s:\n{self.logs()}")

    def outputs(self) -> dict:
        """What left through each outlink so far ("node.outlink" -> entries)."""
        from ..cluster.master_flow import outlink_streams

        if self.ha is not None:
            return self._on_ha("redis", lambda r: read_outputs(r, outlink_streams(self.graph, self.keys)))
        return read_outputs(self.redis, outlink_streams(self.graph, self.keys))

    def sequences(self) -> dict:
        """Each resequence node's outputs as (group, seq), for the checker."""
        if self.ha is not None:
            return self._on_ha("redis", lambda r: read_sequences(r, self.graph, self.keys))
        return read_sequences(self.redis, self.graph, self.keys)

    def uplink_ids(self) -> set[str]:
        """The IDs of every entry the uplink holds (for telling a lost uplink write from a
        message the flow lost)."""
        def read(r):
            out, start = set(), "-"
            while True:
                page = r.xrange(self.keys.uplink, min=start, max="+", count=10_000)
                for eid, fields in page:
                    try:
                        out.add(str(json.loads(fields[b"data"]).get("id")))
                    except (ValueError, KeyError, AttributeError):
                        pass
                if len(page) < 10_000:
                    return out
                start = "(" + page[-1][0].decode()
        return self._on_ha("redis", read) if self.ha is not None else read(self.redis)

    def logs(self, lines: int = 40) -> str:
        """The tail of every node's log, and of the servers' this cluster started."""
        parts = [f"--- {n} ---\n{p.log_tail(lines)}" for n, p in self.nodes.items()]
        if self.services is not None and self.owns_services:
            parts.append(self.services.logs())
        return "\n".join(parts)
