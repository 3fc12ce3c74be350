"""One local cluster: N ``twinflow run`` peers of one flow on real servers, for the tests, the
demo, the benches and the drills; with ``proxied`` every link goes through the fault proxy.

:meth:`LocalCluster.start` starts a real Redis and ZooKeeper (``LocalServices``,
or the caller's ``services``, which it then leaves running), and, unless
``peers=False``, the peer processes. Peers are named ``peer-a``, ``peer-b``, ...
(``peers=3``) or as given (``peers=("a", "b")``).

With ``proxied=True`` the Toxiproxy-compatible fault proxy (``twinflow proxy``,
its own process) sits on every link, each link with a proxy of its own, so a
drill can fault exactly one:

==================  ============================================
proxy               link
==================  ============================================
``redis-<peer>``    that peer to Redis
``zk-<peer>``       that peer to ZooKeeper (``zk-<peer>-<i>`` to
                    member i of an ensemble)
``grpc-<peer>``     escalations (and handovers) into that peer
``producer``        the producer to the uplink
==================  ============================================

Each peer then listens for gRPC on a port picked here and advertises its
proxy's address, so the master's escalations to the worker pass through
``grpc-<worker>``.

With ``redis_mode="sentinel"`` the peers are given a ``redis+sentinel://``
URL (a primary, two replicas and three Sentinels,
:class:`~twinflow.testing.redis_ha.LocalSentinel`), with ``"cluster"`` the URL
of the Redis node that owns the flow's slot on a three-primary Redis Cluster with a
replica each (:class:`~twinflow.testing.redis_ha.LocalRedisCluster`): no proxy
sits on their Redis links, so that a failover is theirs to follow. The
producer and the checker then follow the primary too (``redis_slot.relocate``);
with ``wait_replicas`` the producer's XADDs wait for that many replicas
(``WAIT``), as a producer that must not lose an acknowledged message does.

With ``zk_members=3`` the cluster runs on a three-server ZooKeeper
ensemble (:class:`~twinflow.testing.zk_ensemble.LocalZkEnsemble`) and each
peer's connect string names all three members (each through its own proxy).

A test starts its peers one by one (``peers=()``, then :meth:`LocalCluster.peer`, each with
its own arguments, Redis URL or ZooKeeper address) and waits on their statuses
(:meth:`~LocalCluster.wait_status`). On a sharded flow (``uplink.shards``) each shard runs under
a flow name of its own: ``shard_keys`` are its keys, :meth:`~LocalCluster.shard_statuses` a peer's
status in each, :meth:`~LocalCluster.outputs` merges what left every shard, and
:meth:`~LocalCluster.check` judges one writer per epoch shard by shard. Publishing
(:class:`~twinflow.testing.producers.Producing`) routes each document to its shard's uplink.

Everything it started is stopped by PID in :meth:`stop`, also after an error.
"""

from __future__ import annotations

import dataclasses
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

from ..cluster.on_cluster import flow_keys
from ..cluster.zk_paths import ZkPaths
from ..runtime.flowgraph import load_graph
from ..runtime.shards import ShardRouter, shard_graph
from ..runtime.store.flow_keys import FlowKeys
from ..runtime.waiting import wait_for
from .checker import SinkReport, check_shards, merge_outputs, read_outputs, read_sequences
from .processes import PeerProcess
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
                 peers: int | Sequence[str] = 2, services: LocalServices | None = None, bake_time: float = 5.0,
                 proxied: bool = False, zk_members: int = 1, redis_mode: str = "single", wait_replicas: int = 0,
                 peer_args: Sequence[str] = ()):
        """``text``: the flow file to run (its ``flow:`` is replaced by ``flow``); default the claim pair.
        ``peers=()``: no peer until :meth:`peer` starts one. ``services``: the caller's, or any object
        with ``redis_url`` and ``zk_hosts``. ``peer_args``: more ``twinflow run`` arguments for every peer."""
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="twinflow-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flow = flow
        self.flow_path = self.workdir / "flow.yaml"
        text = CLAIM_PAIR.format(name=flow, bake_time=bake_time) if text is None else text
        self.flow_path.write_text(re.sub(r"(?m)^flow: .*$", f"flow: {flow}", text, count=1))
        self.graph = load_graph(self.flow_path)
        self.keys = FlowKeys(flow, self.graph.cluster.uplink_stream)
        self.sink_key, self.failure_key = self.keys.sink, self.keys.failure
        # A sharded flow (``uplink.shards``): each shard runs under a flow name of its own, with its
        # own keys, election and epochs; publish routes each document to its shard's uplink.
        spec = self.graph.cluster
        self.router = ShardRouter(spec.shards, spec.shard_key)
        self.shard_keys = [flow_keys(shard_graph(self.graph, k)) for k in range(spec.shards)]
        self.peer_ids = ([f"peer-{chr(ord('a') + i)}" for i in range(peers)] if isinstance(peers, int)
                         else list(peers))
        self.services = services
        self.owns_services = services is None
        self.proxied = proxied
        self.zk_members = zk_members
        self.ensemble: LocalZkEnsemble | None = None
        self.proxy_proc: subprocess.Popen | None = None
        self.toxiproxy = None
        self.proxies: dict = {}
        self.peers: dict[str, PeerProcess] = {}
        self._templates: dict[str, PeerProcess] = {}  # peer() starts a copy, its own settings
        self.redis: redis.Redis | None = None    # direct, for the checker
        self.producer: redis.Redis | None = None  # through the producer's proxy when proxied
        self.redis_mode = redis_mode              # single, sentinel or cluster (see module)
        self.wait_replicas = wait_replicas        # the producer's WAIT (HA modes)
        self.ha: LocalSentinel | LocalRedisCluster | None = None
        self.redis_url = ""                       # what the peers are given
        self.peer_args = list(peer_args)
        self.sent: list[str] = []                 # the IDs publish_numbered sent
        self._seq = 0

    # -- life cycle -------------------------------------------------------
    def start(self, peers: bool = True) -> "LocalCluster":
        """Start the servers (and the fault proxy), and the peer processes unless ``peers`` is False
        (:meth:`start_peers` starts them later)."""
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
            for peer_id in self.peer_ids:
                self.peers[peer_id] = self._peer(peer_id, single)
            if single and self.proxied:
                producer = self._proxy("producer", f"127.0.0.1:{self.services.redis.port}")
                self.producer = redis.Redis.from_url(f"redis://{producer.listen}/0", socket_timeout=10)
            if peers:
                self.start_peers()
            return self
        except BaseException:
            self.stop()
            raise

    def _peer(self, peer_id: str, single: bool) -> PeerProcess:
        """The peer's process (not started), its links through their proxies when proxied."""
        zk_members = [f"127.0.0.1:{m.port}" for m in self.ensemble.servers] if self.ensemble else []
        node_redis, zk, extra = self.redis_url, self.zk_hosts, []
        if self.proxied:
            if single:
                node_redis = f"redis://{self._proxy(f'redis-{peer_id}', f'127.0.0.1:{self.services.redis.port}').listen}/0"
            if self.ensemble is None:
                zk = self._proxy(f"zk-{peer_id}", self.services.zk_hosts).listen
            else:
                zk = ",".join(self._proxy(f"zk-{peer_id}-{i + 1}", member).listen
                              for i, member in enumerate(zk_members))
            grpc_port = free_port()
            grpc = self._proxy(f"grpc-{peer_id}", f"127.0.0.1:{grpc_port}")
            extra = ["--listen", f"127.0.0.1:{grpc_port}", "--advertise", grpc.listen]
        return PeerProcess(peer_id, str(self.flow_path), node_redis, zk, str(self.workdir / "state"),
                           str(self.workdir / f"{peer_id}.log"), extra_args=extra + self.peer_args)

    def start_peers(self) -> None:
        for peer in self.peers.values():
            peer.start()

    def peer(self, peer_id: str, *, redis_url: str | None = None, zk: str | None = None,
             extra: Sequence[str] = ()) -> PeerProcess:
        """Start a new ``twinflow run`` process for ``peer_id`` (a new peer, or one that stopped: its
        state dir and log are kept), given ``redis_url`` or ``zk`` in place of the cluster's and
        ``extra`` arguments more."""
        if peer_id not in self._templates:
            self._templates[peer_id] = self.peers.get(peer_id) or self._peer(peer_id, self.redis_mode == "single")
        base = self._templates[peer_id]
        if peer_id not in self.peer_ids:
            self.peer_ids.append(peer_id)
        self.peers[peer_id] = dataclasses.replace(
            base, redis_url=redis_url or base.redis_url, zk_hosts=zk or base.zk_hosts,
            extra_args=[*base.extra_args, *extra], proc=None).start()
        return self.peers[peer_id]

    def _start_ha(self) -> None:
        """A Sentinel group or a Redis Cluster with replicas; the checker's and producer's clients."""
        if self.redis_mode == "sentinel":
            self.ha = LocalSentinel.start(str(self.workdir / "redis-sentinel"), replicas=2, sentinels=3)
            self.redis_url = self.ha.url
        elif self.redis_mode == "cluster":
            self.ha = LocalRedisCluster.start(str(self.workdir / "redis-cluster"), n=3, replicas=1,
                                              node_timeout_ms=1000)
            # The Redis node that owns the flow's slot: the one the drill kills (the URL's Redis node dies).
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
        from ..runtime.store.redis_caller import RedisCaller

        caller = RedisCaller(client=getattr(self, which), on_client=lambda client: setattr(self, which, client))
        return caller.call(call, deadline_s=deadline_s, give_up=lambda exc, waited: RuntimeError(
            f"Redis did not answer the drill's {which} within {deadline_s:.0f} s ({exc})"))

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
        """Stop the peers (SIGTERM: a graceful handover), the proxy and the servers this cluster started."""
        for peer in self.peers.values():
            if peer.proc is not None and peer.alive():
                peer.cont()
                peer.terminate(deadline_s=15)
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
    def status(self, peer_id: str) -> dict:
        """The peer's status hash in Redis ({} when it has none)."""
        if self.ha is not None:
            raw = self._on_ha("redis", lambda r: r.hgetall(self.keys.peer(peer_id)))
        else:
            raw = self.redis.hgetall(self.keys.peer(peer_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def master(self) -> str | None:
        for peer_id, peer in self.peers.items():
            if peer.alive() and self.status(peer_id).get("role") == "master":
                return peer_id
        return None

    def other(self, peer_id: str) -> str:
        return next(n for n in self.peer_ids if n != peer_id)

    def statuses(self) -> dict[str, dict]:
        """Each peer's status hash, for the peers that have one."""
        return {n: st for n in self.peers if (st := self.status(n))}

    def master_epoch(self) -> tuple[str, int] | None:
        """The live master and its epoch, or None."""
        for peer_id, st in self.statuses().items():
            if st.get("role") == "master" and self.peers[peer_id].alive():
                return peer_id, int(st["epoch"])
        return None

    def live_address(self, avoid: str | None = None) -> str | None:
        """The gRPC address of a live peer (other than ``avoid``), for publishing through Ingest."""
        st = self.statuses()
        for peer_id, p in self.peers.items():
            if p.alive() and peer_id != avoid and peer_id in st:
                return st[peer_id]["grpc_address"]
        return None

    def sink_count(self) -> int:
        return self.redis.xlen(self.sink_key)

    def wait_ready(self, timeout_s: float = 120) -> str:
        """Until one peer is master and every live peer streams; returns the master."""
        def ready():
            live = [n for n, p in self.peers.items() if p.alive()]
            if any(self.status(n).get("streaming") != "1" for n in live):
                return None
            return self.master()
        master = wait_for(ready, timeout_s, 0.2)
        if master is None:
            raise RuntimeError("the cluster did not become ready:\n" + self.logs())
        return master

    def wait_status(self, peer_id: str, timeout_s: float = 90, **want) -> dict:
        """Until ``peer_id``'s status has each ``want`` (``role="master", streaming=1``); returns it.
        Fails at once should the peer's process exit."""
        def ok():
            if not self.peers[peer_id].alive():
                raise RuntimeError(f"{peer_id} exited:\n{self.logs(60)}")
            st = self.status(peer_id)
            return st if st and all(st.get(k) == str(v) for k, v in want.items()) else None
        st = wait_for(ok, timeout_s, 0.1)
        if not st:
            raise RuntimeError(f"{peer_id} not {want} within {timeout_s:.0f} s:\n{self.logs(60)}")
        return st

    def wait_role(self, peer_id: str, role: str, timeout_s: float = 60) -> None:
        if not wait_for(lambda: self.status(peer_id).get("role") == role, timeout_s, 0.1):
            raise RuntimeError(f"{peer_id} did not become {role} within {timeout_s:.0f} s:\n{self.logs()}")

    def restart(self, peer_id: str, timeout_s: float = 120) -> None:
        """Start a stopped peer again and wait until this new process streams (the status a
        killed process left in Redis lives on for a few seconds: the PID tells them apart)."""
        peer = self.peers[peer_id]
        peer.start()
        pid = str(peer.pid)
        if not wait_for(lambda: self.status(peer_id).get("pid") == pid and self.status(peer_id).get("streaming") == "1",
                        timeout_s, 0.2):
            raise RuntimeError(f"{peer_id} did not stream again within {timeout_s:.0f} s:\n{self.logs()}")

    def key(self, suffix: str) -> str:
        """The flow's Redis key ``suffix`` (``"uplink"``, ``"state:match"``, ...)."""
        return self.keys.prefix + suffix

    def stream(self, suffix: str) -> list[tuple[float, dict]]:
        """A stream's entries as (Redis time in s, fields other than data)."""
        return [(int(eid.decode().split("-")[0]) / 1000,
                 {k.decode(): v.decode() for k, v in f.items() if k != b"data"})
                for eid, f in self.redis.xrange(self.key(suffix))]

    def read_upto(self, peer_id: str) -> str | None:
        """The last uplink position whose batch ``peer_id`` processed and Spark committed."""
        raw = self.redis.hget(self.keys.read(peer_id), "read_id")
        return raw.decode() if raw else None

    def zk_epoch(self) -> int:
        """The version of the flow's epoch znode: how many promotions there were."""
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.zk_hosts)
        zk.start(timeout=10)
        try:
            stat = zk.exists(ZkPaths(self.flow).epoch)
            return stat.version if stat else 0
        finally:
            zk.stop()
            zk.close()

    def outputs(self) -> dict:
        """What left through each outlink so far ("peer.outlink" -> entries), of every shard."""
        return merge_outputs(self.shard_outputs())

    def shard_outputs(self) -> list[dict]:
        """:meth:`outputs` of each shard (one for an unsharded flow)."""
        from ..cluster.master_flow import outlink_streams

        keys = self.shard_keys if self.router.shards > 1 else [self.keys]
        if self.ha is not None:
            return [self._on_ha("redis", lambda r, k=k: read_outputs(r, outlink_streams(self.graph, k))) for k in keys]
        return [read_outputs(self.redis, outlink_streams(self.graph, k)) for k in keys]

    def check(self, sent_ids: list[str], faults=()) -> SinkReport:
        """Every promise over what left the flow (:func:`~twinflow.testing.checker.check`); on a
        sharded flow one writer per epoch and nothing stale are judged per shard, each shard
        having epochs of its own."""
        return check_shards(self.shard_outputs(), sent_ids, faults, sequences=self.sequences())

    def shard_statuses(self, peer_id: str) -> list[dict]:
        """The peer's status hash in each shard."""
        return [{k.decode(): v.decode() for k, v in self.redis.hgetall(keys.peer(peer_id)).items()}
                for keys in self.shard_keys]

    def wait_shards(self, peer_id: str, role: str, timeout_s: float = 120) -> list[dict]:
        """Until ``peer_id`` is ``role`` of every shard and streams; returns its statuses."""
        def ok():
            rows = self.shard_statuses(peer_id)
            return rows if all(r.get("role") == role and r.get("streaming") == "1" for r in rows) else None
        rows = wait_for(ok, timeout_s, 0.2)
        if not rows:
            raise RuntimeError(f"{peer_id} not {role} of every shard within {timeout_s:.0f} s:\n{self.logs()}")
        return rows

    def describe_shards(self) -> str:
        """Each shard's uplink, processed mark and peer statuses, for a failure message."""
        r = self.redis
        return "; ".join(
            f"{keys.flow}: uplink {r.xlen(keys.uplink)} last {r.xrevrange(keys.uplink, count=1)}, "
            f"processed {r.get(keys.processed)}, peers {[r.hgetall(keys.peer(n)) for n in self.peer_ids]}, "
            f"read {[r.hgetall(keys.read(n)) for n in self.peer_ids]}"
            for keys in self.shard_keys)

    def sequences(self) -> dict:
        """Each resequence peer's outputs as (group, seq), for the checker."""
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
        """The tail of every peer's log, and of the servers' this cluster started."""
        parts = [f"--- {n} ---\n{p.log_tail(lines)}" for n, p in self.peers.items()]
        if self.services is not None and self.owns_services:
            parts.append(self.services.logs())
        return "\n".join(parts)
