"""A lab of hosts on this machine: servers, peers and a client, each in a network namespace of
its own with its own address, all on one private bridge (``twinflow lab up|status|down``).

:meth:`Lab.up` makes the network (:mod:`.lab_network`), the secrets and flow file, then starts
what each host runs (:mod:`.lab_hosts`), each process through ``ip netns exec`` in a session
of its own (its PID is its process group's, so a kill takes a peer's JVM along), and waits
until each answers, as seen from the client host: Redis (and, full form, its replica linked
and the Sentinels agreeing on the primary), ZooKeeper (the ensemble serving with a leader),
the Spark master with both workers ALIVE (full form), then both peers streaming with one
master. The lab's state file (``<dir>/lab.json``) lists every namespace, directory and
process as it is made or started, so ``twinflow lab down`` (:meth:`Lab.down`) removes
exactly that, also after a crash of the command that made it. Each ``up`` starts every server
on empty data: the ``hosts/`` directory (data and logs) of a lab taken down before in the same
directory goes first; the secrets are kept and reused.

:meth:`Lab.kill_host` SIGKILLs every process group of one host at once (a machine that dies),
:meth:`Lab.publisher` runs the client host's publisher (:mod:`.lab_client`), and
:meth:`Lab.redis` is a Redis client, made in the client host's namespace, on the primary:
the checker reads the flow's outputs with it (:meth:`Lab.outputs`).

Under failure: not root or no usable ``ip netns`` raises
:class:`~.lab_network.LabUnavailable` before anything is made; a lab already recorded in the
directory, or namespaces of the same prefix, raise :class:`LabError` and nothing is touched.
A server that exits or does not answer before its deadline raises :class:`LabError` with the
tail of its log, after everything already made is removed (the logs stay in the directory).
Every wait has a deadline.
"""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

from .lab_hosts import (PEERS, REDIS_PORT, SENTINEL_PORTS, SERVICE, SPARK_WEBUI_PORT, ZK_PORT, Launch, LabPlan,
                        operator_command, peer_command, peer_stop_command, publisher_command, redis_launches, spark_launches,
                        zookeeper_launches)
from .lab_console import ConsoleForward
from .lab_flow import FlowReadings
from .lab_network import (DEFAULT_PREFIX, DEFAULT_SUBNET, NETNS_ETC, HostOps, LabProcess, LabState, check_usable,
                          connect_in, create, entered, netns_exec, ns_inode, pids_in, teardown)
from twinflow.testing.servers import log_tail

STATE_FILE = "lab.json"
SERVER_DEADLINE_S = 60.0
PEER_DEADLINE_S = 120.0


class LabError(RuntimeError):
    """The lab could not be made or used; the message says which host and server, with its log."""


class NetnsConnection(redis.Connection):
    """A redis-py connection whose socket is made in network namespace ``netns`` (each
    reconnection too): a client in this machine's namespace never dials the lab from here."""

    def __init__(self, netns: str, **kwargs):
        self.netns = netns
        super().__init__(**kwargs)

    def _connect(self):
        with entered(self.netns):
            return super()._connect()


def redis_in(ns: str, host: str, port: int, password: str | None = None, **options) -> redis.Redis:
    """A Redis client for ``host:port`` whose connections are made in namespace ``ns``."""
    pool = redis.ConnectionPool(connection_class=NetnsConnection, netns=ns, host=host, port=port,
                                password=password, socket_timeout=options.pop("socket_timeout", 3),
                                socket_connect_timeout=options.pop("socket_connect_timeout", 1), **options)
    return redis.Redis(connection_pool=pool)


class _NetnsHttp(http.client.HTTPConnection):
    def __init__(self, ns: str, host: str, port: int, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.ns = ns

    def connect(self) -> None:
        self.sock = connect_in(self.ns, self.host, self.port, self.timeout)


class Lab(FlowReadings):
    """A lab in ``directory`` (see module): ``short`` for the short form; ``prefix`` begins every
    namespace name (give each lab running at once its own)."""

    def __init__(self, directory: str | Path, short: bool = False, prefix: str = DEFAULT_PREFIX,
                 subnet: str = DEFAULT_SUBNET, flow: str = "lab", shards: int = 1, spark_cluster: bool = True):
        self.directory = Path(directory).resolve()
        state = LabState(prefix=prefix, subnet=subnet, info={"form": "short" if short else "full", "flow": flow,
                                                              "shards": shards, "spark_cluster": spark_cluster})
        self.plan = LabPlan(self.directory, state, short=short, flow=flow, shards=shards, spark_cluster=spark_cluster)
        self._children: dict[int, subprocess.Popen] = {}
        self._flow = None

    @property
    def state(self) -> LabState:
        return self.plan.state

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    @classmethod
    def load(cls, directory: str | Path) -> "Lab":
        """The lab recorded in ``directory`` (FileNotFoundError when there is none)."""
        path = Path(directory).resolve() / STATE_FILE
        state = LabState.load(path)
        lab = cls(directory, short=state.info.get("form") == "short", prefix=state.prefix, subnet=state.subnet,
                  flow=state.info.get("flow", "lab"), shards=state.info.get("shards", 1),
                  spark_cluster=state.info.get("spark_cluster", True))
        lab.plan.state = state
        return lab

    def save(self) -> None:
        self.state.save(self.state_path)

    # -- up -----------------------------------------------------------------------------------
    def up(self, say: Callable[[str], None] = lambda text: None) -> "Lab":
        """Make the network and start every host's servers, then the peers; return when both
        peers stream and one is master (see module)."""
        check_usable(self.state.prefix)
        if self.state_path.exists():
            raise LabError(f"a lab is already recorded in {self.state_path} (twinflow lab down --dir {self.directory})")
        self.plan.add_hosts()
        names = sorted({h.ns for h in self.state.hosts} | {self.state.hub})
        taken = [ns for ns in names if ns_inode(ns) is not None] + [
            str(NETNS_ETC / ns) for ns in names if (NETNS_ETC / ns).exists()]
        if taken:
            more = f" and {len(taken) - 3} more" if len(taken) > 3 else ""
            raise LabError(f"{', '.join(taken[:3])}{more} exist already: another lab uses the prefix "
                           f"{self.state.prefix!r} (take it down, or give this one another prefix)")
        # Every server starts on empty data: a lab taken down before in this directory left its
        # servers' data (Redis's append-only file, ZooKeeper's epochs, the peers' checkpoints).
        shutil.rmtree(self.directory / "hosts", ignore_errors=True)
        t0 = time.monotonic()
        try:
            create(self.state, self.state_path)
            self.plan.prepare()
            say(f"network: {len(self.state.hosts)} hosts on {self.state.subnet} ({time.monotonic() - t0:.1f} s)")
            servers = [self._start(x) for x in redis_launches(self.plan) + zookeeper_launches(self.plan)
                       + spark_launches(self.plan)]
            self._wait_servers(servers, time.monotonic() + SERVER_DEADLINE_S)
            say(f"servers: {len(servers)} answering ({time.monotonic() - t0:.1f} s)")
            peers = [self._start(peer_command(self.plan, p)) for p in PEERS]
            master = self._wait_peers(peers, time.monotonic() + PEER_DEADLINE_S)
            self.state.info["up_s"] = round(time.monotonic() - t0, 1)
            self.save()
            say(f"peers: both stream; master: {master} ({self.state.info['up_s']} s)")
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, launch: Launch) -> LabProcess:
        """Start ``launch`` in its host's namespace, in a session of its own; recorded at once."""
        Path(launch.cwd).mkdir(parents=True, exist_ok=True)
        ns = self.state.host(launch.host).ns
        with open(launch.log, "ab") as log:
            proc = subprocess.Popen(netns_exec(ns, launch.argv), env=launch.env, cwd=launch.cwd, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    executable=shutil.which("ip"))
        self._children[proc.pid] = proc
        record = LabProcess(launch.host, launch.name, proc.pid, launch.log, launch.port)
        self.state.processes.append(record)
        self.save()
        return record

    def alive(self, p: LabProcess) -> bool:
        """The process still runs: one this object started, by its exit status (until ``ip netns
        exec`` has entered the namespace, the process is not in it yet); any other only while it
        is in its host's namespace (a PID reused since does not count)."""
        child = self._children.get(p.pid)
        if child is not None:
            return child.poll() is None
        return p.pid in pids_in(self.state.host(p.host).ns)

    def _wait(self, what: str, ready: Callable[[], object], end: float, watch: list[LabProcess]):
        while True:
            for p in watch:
                if not self.alive(p):
                    raise LabError(f"{p.name} on {p.host} (pid {p.pid}) exited while waiting for {what}; "
                                   f"log {p.log}:\n{log_tail(p.log)}")
            value = ready()
            if value:
                return value
            if time.monotonic() > end:
                raise LabError(f"no {what} before the deadline; logs:\n" + self.logs(watch))
            time.sleep(0.1)

    def _wait_servers(self, servers: list[LabProcess], end: float) -> None:
        for p in servers:
            self._wait(f"{p.name} answering on {p.host}", lambda p=p: self.answers(p), end, servers)
        if not self.plan.short:
            self._wait("the Sentinels agreeing on the primary and its replica", self._sentinels_ready, end, servers)
            self._wait("both Spark workers ALIVE", lambda: len(self._spark_workers()) == 2, end, servers)

    def _wait_peers(self, peers: list[LabProcess], end: float) -> str:
        def ready():
            rows = self.peer_statuses()
            started = all(rows.get(p.host, {}).get("pid") == str(p.pid) for p in peers)
            return started and self.ready() and (self.master() or "split by shard")
        return self._wait("both peers streaming with one master (of every shard)", ready, end, peers)

    # -- asking the lab (from the client host's namespace) --------------------------------------
    @property
    def client_ns(self) -> str:
        return self.state.host("client").ns

    def console(self, peer: str, listen: tuple[str, int] = ("127.0.0.1", 0)) -> ConsoleForward:
        """Peer ``peer``'s console (HTTPS, its ``peer-X.lab`` certificate) on ``listen`` of this machine."""
        return ConsoleForward(self.client_ns, self.state.host(peer).address, listen=listen)

    def answers(self, p: LabProcess) -> bool:
        """Whether the server ``p`` answers its protocol on its address, seen from the client host."""
        addr = self.state.host(p.host).address
        try:
            if p.name in ("redis", "replica"):
                return self._ping(addr, p.port, self.plan.redis_password())
            if p.name.startswith("sentinel"):
                return self._ping(addr, p.port)
            if p.name == "zookeeper":
                return self._zk_mode(addr) in ("leader", "follower", "standalone")
            if p.name == "spark-master":
                return (self.spark_state() or {}).get("status") == "ALIVE"
            if p.name == "spark-worker":
                return any(w.get("host") == f"{p.host}.lab" for w in self._spark_workers())
            if p.host in PEERS:
                return self.peer_statuses().get(p.host, {}).get("pid") == str(p.pid)
        except (OSError, redis.RedisError):
            return False
        return False

    def _ping(self, address: str, port: int, password: str | None = None) -> bool:
        client = redis_in(self.client_ns, address, port, password)
        try:
            return bool(client.ping())
        finally:
            client.close()

    def zk_word(self, address: str, word: str) -> str:
        """A ZooKeeper server's reply to a four-letter word (``srvr``, ``mntr``), asked from the
        client host; OSError when it does not answer."""
        with connect_in(self.client_ns, address, ZK_PORT) as sock:
            sock.sendall(word.encode())
            reply = b""
            while len(reply) < 65536 and (chunk := sock.recv(4096)):  # each recv within the socket's time-out
                reply += chunk
        return reply.decode(errors="replace")

    def _zk_mode(self, address: str) -> str | None:
        for line in self.zk_word(address, "srvr").splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None

    def spark_state(self) -> dict | None:
        """The Spark master's view (its web UI's ``/json/``), None when it does not answer."""
        conn = _NetnsHttp(self.client_ns, self._spark_address(), SPARK_WEBUI_PORT, 2.0)
        try:
            conn.request("GET", "/json/")
            return json.loads(conn.getresponse().read())
        except (OSError, ValueError, http.client.HTTPException):
            return None
        finally:
            conn.close()

    def _spark_address(self) -> str:
        return self.plan.address("spark")

    def _spark_workers(self) -> list[dict]:
        return [w for w in (self.spark_state() or {}).get("workers", []) if w.get("state") == "ALIVE"]

    def _sentinels_ready(self) -> bool:
        addr = self.plan.address("redis")
        return all(self._sentinel_agrees(addr, port, SERVICE, replicas=1) for port in SENTINEL_PORTS)

    def _sentinel_agrees(self, address: str, port: int, service: str, replicas: int) -> bool:
        """The Sentinel at ``address:port`` sees ``service``'s primary up with at least
        ``replicas`` replicas, and the two other Sentinels."""
        client = redis_in(self.client_ns, address, port, decode_responses=True)
        try:
            view = client.execute_command("SENTINEL MASTER", service)
        except (OSError, redis.RedisError):
            return False
        finally:
            client.close()
        if isinstance(view, list):
            view = dict(zip(view[::2], view[1::2]))
        return (view.get("flags") == "master" and int(view.get("num-slaves", 0)) >= replicas
                and int(view.get("num-other-sentinels", 0)) >= 2)

    def redis(self) -> redis.Redis:
        """A client on the Redis primary (the one the Sentinels name, full form), its connections
        made in the client host's namespace."""
        addr, port = self.plan.address("redis"), REDIS_PORT
        if not self.plan.short:
            sentinel = redis_in(self.client_ns, addr, SENTINEL_PORTS[0], decode_responses=True)
            try:
                named = sentinel.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)
            finally:
                sentinel.close()
            if not named:
                raise LabError(f"the Sentinel on redis.lab:{SENTINEL_PORTS[0]} names no primary for {SERVICE}")
            addr, port = named
        return redis_in(self.client_ns, addr, port, self.plan.redis_password())

    # -- acting on it ---------------------------------------------------------------------------
    def publisher(self, count: int, rate: float, acked: str | Path, first: int = 0) -> LabProcess:
        """Start the client host publishing (see :func:`.lab_hosts.publisher_command`)."""
        return self._start(publisher_command(self.plan, count, rate, acked, first))

    def operator(self, *args: str, timeout_s: float = 60.0, certificate: bool = True) -> subprocess.CompletedProcess:
        """``twinflow ARGS`` as an operator on the client host (:func:`.lab_hosts.operator_command`),
        run to its end; its output and exit status. ``certificate`` False: without the client's
        certificate and key (the CA and token still given)."""
        launch = operator_command(self.plan, list(args))
        if not certificate:
            launch.env.pop("TWINFLOW_TLS_CERT")
            launch.env.pop("TWINFLOW_TLS_KEY")
        Path(launch.cwd).mkdir(parents=True, exist_ok=True)
        return subprocess.run(netns_exec(self.client_ns, launch.argv), env=launch.env, cwd=launch.cwd,
                              capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)

    def wait_exit(self, p: LabProcess, deadline_s: float) -> int | None:
        """The exit status of a process this object started, once it ends (None at the deadline)."""
        try:
            return self._children[p.pid].wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            return None

    def kill_host(self, host: str, deadline_s: float = 10.0) -> float:
        """SIGKILL every process on ``host`` at once, as when the machine dies: each process group
        the lab started there, then anything else left in its namespace (a Spark worker's
        executors); return the time of the kill (epoch s) once no process is left in it."""
        ns = self.state.host(host).ns
        ops = HostOps()
        groups = [p.pid for p in self.state.processes if p.host == host and ops.group_in(p.pid, ns)]
        killed_at = time.time()
        for g in groups:
            ops.signal_group(g, signal.SIGKILL)
        for pid in pids_in(ns):  # started by a process of the host, in a group of their own
            ops.signal(pid, signal.SIGKILL)
        for g in groups:
            child = self._children.get(g)
            if child is not None:
                child.wait(timeout=deadline_s)
        if not ops.wait(lambda: not pids_in(ns), deadline_s):
            raise LabError(f"processes {pids_in(ns)} still in {ns} {deadline_s:.0f} s after the kill")
        return killed_at

    def process(self, host: str, name: str) -> LabProcess:
        """The newest process called ``name`` the lab started on ``host``."""
        for p in reversed(self.state.processes):
            if p.host == host and p.name == name:
                return p
        raise LabError(f"the lab started no {name} on {host}")

    def start_peer(self, host: str, env: dict[str, str] | None = None) -> LabProcess:
        """Start peer ``host`` as its unit's ``ExecStart`` does (``env`` added to its environment,
        e.g. a fake clock); returns at once (see :meth:`wait_streaming`)."""
        launch = peer_command(self.plan, host)
        launch.env.update(env or {})
        return self._start(launch)

    def stop_peer(self, host: str, deadline_s: float = 30.0) -> int | None:
        """Stop peer ``host`` as its unit's ``ExecStop`` does (``kill -TERM $MAINPID``: a master
        hands over first), then, as ``TimeoutStopSec`` says, SIGKILL its group after
        ``deadline_s``; returns its exit status (-9: it had to be killed; None: not a process
        this object started, whose status it cannot know)."""
        p = self.process(host, "twinflow-run")
        return self._stop_unit(p, peer_stop_command(self.plan, host, p.pid), deadline_s)

    def _stop_unit(self, p: LabProcess, argv: list[str], deadline_s: float) -> int | None:
        """Stop ``p`` as systemd stops a unit: its ``ExecStop`` ``argv``, then SIGKILL of its group
        after ``deadline_s``; its exit status (see :meth:`stop_peer`)."""
        host = p.host
        # As systemd, whatever ExecStop says: a peer already gone has nothing left to stop.
        subprocess.run(netns_exec(self.state.host(host).ns, argv), timeout=10, executable=shutil.which("ip"),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ops = HostOps()
        ns = self.state.host(host).ns
        if not ops.wait(lambda: not ops.group_in(p.pid, ns), deadline_s):
            ops.signal_group(p.pid, signal.SIGKILL)
            ops.wait(lambda: not ops.group_in(p.pid, ns), 10)
        child = self._children.get(p.pid)
        return None if child is None else child.wait(timeout=10)

    def start_server(self, host: str, name: str) -> LabProcess:
        """Start server ``name`` on ``host`` again, on the data it left (a host that came back)."""
        launches = redis_launches(self.plan) + zookeeper_launches(self.plan) + spark_launches(self.plan)
        launch = next((x for x in launches if x.host == host and x.name == name), None)
        if launch is None:
            raise LabError(f"no server {name} on {host} in the {self.state.info['form']} form")
        p = self._start(launch)
        self._wait_servers([p], time.monotonic() + SERVER_DEADLINE_S)
        return p

    def wait_streaming(self, host: str, deadline_s: float = PEER_DEADLINE_S) -> None:
        """Wait until peer ``host``'s newest process streams (its status in Redis says so)."""
        p = self.process(host, "twinflow-run")
        self._wait(f"{host} streaming", lambda: (lambda r: r.get("streaming") == "1" and r.get("pid") == str(p.pid))(
            self.peer_statuses().get(host, {})), time.monotonic() + deadline_s, [p])

    def status(self) -> list[dict]:
        """One row per process the lab started: host, address, name, port, PID, alive, answers,
        and a peer's role and epoch."""
        try:
            roles = self.peer_statuses()
        except (OSError, redis.RedisError, LabError):  # Redis down: no roles, the rest still shown
            roles = {}
        rows = []
        for p in self.state.processes:
            alive = self.alive(p)
            host = self.state.host(p.host)
            row = {"host": host.fqdn, "address": host.address, "process": p.name,
                   "port": p.port or "", "pid": p.pid, "alive": alive,
                   "answers": (alive and self.answers(p)) if p.port else None,
                   "role": "", "epoch": ""}
            peer = self.peer_of(p)
            if peer is not None and roles.get(peer, {}).get("pid") == str(p.pid):
                row["role"], row["epoch"] = roles[peer].get("role", ""), roles[peer].get("epoch", "")
            rows.append(row)
        return rows

    def peer_of(self, p: LabProcess) -> str | None:
        """The peer ID ``p`` runs, when it is a peer (here a peer's host is named as the peer)."""
        return p.host if p.host in PEERS and p.name == "twinflow-run" else None

    def logs(self, processes: list[LabProcess] | None = None, lines: int = 25) -> str:
        return "\n".join(f"--- {p.name} on {p.host} ({p.log}) ---\n{log_tail(p.log, lines)}"
                         for p in (processes if processes is not None else self.state.processes))

    # -- down -----------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Remove what the state file lists (processes, veths, namespaces, /etc/netns dirs), then
        the state file; the lab directory (logs, secrets) stays. Returns what was done."""
        done = teardown(self.state)
        for child in self._children.values():
            try:
                child.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.state_path.unlink(missing_ok=True)
        return done
