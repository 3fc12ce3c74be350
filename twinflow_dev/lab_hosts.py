"""What each lab host runs: the hosts of a lab's two forms, their secrets and flow file, and the
command line and environment of every server, peer and client on them.

The **full** form has ``redis`` (a primary, a replica and three Sentinels, on different ports
of its one address), ``zk1``-``zk3`` (one ZooKeeper ensemble, ``tickTime`` 200 ms), ``spark``
(a standalone master) with ``sw1`` and ``sw2`` (a worker each), ``peer-a`` and ``peer-b``
(``twinflow run`` on the chained flow, their batches on the Spark cluster) and ``client``.
The **short** form has ``redis`` (one server, no Sentinel), ``zk1`` (one ZooKeeper),
``peer-a``, ``peer-b`` (Spark in local mode, in the peer) and ``client``.

Every server binds to its host's address only; a peer listens on ``0.0.0.0:7070`` of its own
namespace and advertises ``peer-X.lab:7070``. gRPC runs over mutual TLS with a token per
scope (certificates from :func:`twinflow.certs.make_certs`, as ``twinflow certs`` makes them),
Redis asks for a password (``TWINFLOW_REDIS_PASSWORD``), ZooKeeper keeps the flow's znodes
behind digest credentials (``TWINFLOW_ZK_AUTH``); every secret is a file under
``<dir>/secrets`` (mode 0600) named by reference, never on a command line.

:func:`peer_command` is the one place a peer host's command is made: a later change takes it
from a systemd unit file instead.

Nothing here starts anything: each function returns a :class:`Launch` (:mod:`.lab` starts
it), having written the server's configuration files under ``<dir>/hosts/<host>/``. Under
failure: a lab directory that cannot be written raises ``OSError``; nothing else here touches
the machine.

>>> from twinflow_dev.lab_network import LabState
>>> plan = LabPlan("/tmp/lab", LabState(), short=True, flow="lab")
>>> plan.add_hosts()
>>> [h.name for h in plan.state.hosts]
['redis', 'zk1', 'peer-a', 'peer-b', 'client']
>>> plan.redis_url, plan.zk_hosts, plan.spark_master
('redis://redis.lab:6379/0', 'zk1.lab:2181', 'local[1]')
>>> launch = peer_command(plan, "peer-b")
>>> launch.argv[launch.argv.index("--advertise") + 1], launch.env["SPARK_LOCAL_IP"]
('peer-b.lab:7070', '10.213.47.32')
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .lab_console import CONSOLE_PORT
from .lab_network import LabState
from twinflow.testing.messages import CHAINED
from twinflow.testing.redis_ha import SENTINEL_CONF
from twinflow.testing.servers import ZOO_CFG, conf_quote, redis_argv, zookeeper_argv
from twinflow.testing.spark_standalone import daemon_env, spark_class
from .systemd_unit import ServiceUnit, UnitError, read_environment_file

# name -> last octet of its address, in the order the hosts are made.
FULL_HOSTS = {"redis": 10, "zk1": 11, "zk2": 12, "zk3": 13, "spark": 20, "sw1": 21, "sw2": 22,
              "peer-a": 31, "peer-b": 32, "client": 40}
SHORT_HOSTS = {"redis": 10, "zk1": 11, "peer-a": 31, "peer-b": 32, "client": 40}
PEERS = ("peer-a", "peer-b")
REDIS_PORT, REPLICA_PORT, SENTINEL_PORTS = 6379, 6380, (26379, 26380, 26381)
SERVICE = "mymaster"
ZK_PORT, ZK_QUORUM_PORT, ZK_ELECTION_PORT = 2181, 2888, 3888
SPARK_PORT, SPARK_WEBUI_PORT, WORKER_WEBUI_PORT = 7077, 8080, 8081
PEER_PORT = 7070
SCOPES = ("ingest", "escalation", "admin")
# Each peer's share of the full form's two one-core workers.
# The deployment guide's unit and environment file, which the lab's peers run (a source checkout).
DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "systemd"
PEER_SPARK_CONF = {"spark.cores.max": "1", "spark.executor.memory": "512m"}


@dataclass
class Launch:
    """A process a host runs: its argv and environment, the directory it runs in and its log."""

    host: str
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    port: int = 0


@dataclass
class LabPlan:
    """A lab's directory, network state, form and flow name: what every command is made from."""

    directory: str | Path
    state: LabState = field(default_factory=LabState)
    short: bool = False
    flow: str = "lab"
    shards: int = 1  # the chained flow in this many uplink shards (keyed by order_id)
    # The full form's peers run their batches on its Spark cluster; False: in Spark's local mode
    # in the peer, as the deployment guide advises for an unsharded flow (the cluster still runs).
    spark_cluster: bool = True

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)

    def add_hosts(self) -> None:
        """Record the form's hosts in the state (not yet made)."""
        for name, octet in (SHORT_HOSTS if self.short else FULL_HOSTS).items():
            self.state.add_host(name, octet)

    # -- where things are --------------------------------------------------------------------
    @property
    def secrets(self) -> Path:
        return self.directory / "secrets"

    @property
    def flow_path(self) -> Path:
        return self.directory / "flow.yaml"

    def host_dir(self, host: str) -> Path:
        return self.directory / "hosts" / host

    def address(self, host: str) -> str:
        return self.state.host(host).address

    @property
    def redis_url(self) -> str:
        """What the peers are given: the Sentinels (full form) or the one Redis (short form)."""
        if self.short:
            return f"redis://redis.lab:{REDIS_PORT}/0"
        return "redis+sentinel://" + ",".join(f"redis.lab:{p}" for p in SENTINEL_PORTS) + f"/{SERVICE}/0"

    @property
    def zk_hosts(self) -> str:
        return ",".join(f"{h}.lab:{ZK_PORT}" for h in self.zk_names)

    @property
    def zk_names(self) -> list[str]:
        return ["zk1"] if self.short else ["zk1", "zk2", "zk3"]

    @property
    def spark_master(self) -> str:
        return "local[1]" if self.short or not self.spark_cluster else self.spark_cluster_url

    @property
    def spark_cluster_url(self) -> str:
        """The full form's Spark standalone master (its workers register there)."""
        return f"spark://spark.lab:{SPARK_PORT}"

    @property
    def peer_addresses(self) -> list[str]:
        return [f"{p}.lab:{PEER_PORT}" for p in PEERS]

    def redis_password(self) -> str:
        return (self.secrets / "redis.pw").read_text().strip()

    # -- what the hosts share ------------------------------------------------------------------
    def prepare(self) -> None:
        """The secrets (CA, a certificate per peer and for the client, tokens, Redis password,
        ZooKeeper credentials) and the flow file, made once."""
        from twinflow.certs import make_certs
        import secrets as random_secrets

        for name in (*PEERS, "client"):
            if not (self.secrets / f"{name}.pem").exists():
                # A peer's also names localhost: its console, forwarded to this machine (lab_console.py).
                make_certs(self.secrets, name, [f"{name}.lab", *(["localhost"] if name in PEERS else [])])
        for name, value in (("redis.pw", random_secrets.token_urlsafe(24)),
                            ("zk.auth", f"lab:{random_secrets.token_urlsafe(18)}")):
            path = self.secrets / name
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(value + "\n")
        text = re.sub(r"(?m)^flow: .*$", f"flow: {self.flow}", CHAINED.read_text(), count=1)
        if self.shards > 1:
            sharded = rf'uplink: {{\1, shards: {self.shards}, shard_key: "{{order_id}}"}}'
            text = re.sub(r"(?m)^uplink: \{(.*)\}$", sharded, text, count=1)
        self.flow_path.write_text(text)


def base_env() -> dict[str, str]:
    """The environment every lab process starts from: little, as a service manager gives."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "JAVA_HOME") if k in os.environ}
    return {**env, "LANG": "C.UTF-8"}


def _launch(plan: LabPlan, host: str, name: str, argv: list[str], port: int = 0,
            env: dict[str, str] | None = None) -> Launch:
    d = plan.host_dir(host) / name
    return Launch(host, name, argv, {**base_env(), **(env or {})}, str(d), str(d / f"{name}.log"), port)


# -- Redis ----------------------------------------------------------------------------------------
def redis_launches(plan: LabPlan) -> list[Launch]:
    """The short form's one Redis; the full form's primary, replica and three Sentinels."""
    addr = plan.address("redis")
    auth = plan.host_dir("redis") / "auth.conf"
    auth.parent.mkdir(parents=True, exist_ok=True)
    auth.touch(mode=0o600)
    password = conf_quote(plan.redis_password())
    auth.write_text(f"requirepass {password}\nmasterauth {password}\n")
    data = [("redis", REDIS_PORT, ())]
    if not plan.short:
        data.append(("replica", REPLICA_PORT, ("--replicaof", addr, str(REDIS_PORT))))
    out = []
    for name, port, extra in data:
        d = plan.host_dir("redis") / name
        d.mkdir(parents=True, exist_ok=True)
        out.append(_launch(plan, "redis", name, redis_argv(d, *extra, port=port, bind=addr, config=auth), port))
    if plan.short:
        return out
    for i, port in enumerate(SENTINEL_PORTS):
        name = f"sentinel{i + 1}"
        d = plan.host_dir("redis") / name
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "sentinel.conf"  # Sentinel rewrites it: its own copy, writable
        conf.touch(mode=0o600)
        conf.write_text(SENTINEL_CONF.format(port=port, bind=addr, dir=d, service=SERVICE, primary_host=addr,
                                             primary=REDIS_PORT, quorum=2, down_after_ms=1000,
                                             failover_timeout_ms=4000)
                        + f"sentinel auth-pass {SERVICE} {password}\n")
        out.append(_launch(plan, "redis", name, ["redis-server", str(conf), "--sentinel"], port))
    return out


# -- ZooKeeper ------------------------------------------------------------------------------------
def zookeeper_launches(plan: LabPlan) -> list[Launch]:
    """One server per zk host, bound to its address; with several, one ensemble whose quorum
    and election ports are on the members' addresses."""
    names = plan.zk_names
    quorum = "" if len(names) == 1 else "".join(
        f"server.{i + 1}={plan.address(n)}:{ZK_QUORUM_PORT}:{ZK_ELECTION_PORT}\n" for i, n in enumerate(names))
    out = []
    for i, host in enumerate(names):
        d = plan.host_dir(host) / "zookeeper"
        data = d / "data"
        data.mkdir(parents=True, exist_ok=True)
        if quorum:
            (data / "myid").write_text(f"{i + 1}\n")
        cfg = d / "zoo.cfg"
        cfg.write_text(ZOO_CFG.format(data_dir=data, port=ZK_PORT, address=plan.address(host)) + quorum)
        out.append(_launch(plan, host, "zookeeper", zookeeper_argv(d, cfg), ZK_PORT))
    return out


# -- Spark ----------------------------------------------------------------------------------------
def spark_launches(plan: LabPlan) -> list[Launch]:
    """The full form's standalone master on ``spark`` and a one-core worker on ``sw1`` and ``sw2``,
    each bound to its host's address (SPARK_LOCAL_IP, --host)."""
    if plan.short:
        return []
    out = []
    for host in ("spark", "sw1", "sw2"):
        name = "spark-master" if host == "spark" else "spark-worker"
        d = plan.host_dir(host) / name
        for sub in ("work", "local", "conf"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        env = daemon_env(plan.address(host), str(d / "local"), str(d / "work"), str(d / "conf"))
        if host == "spark":
            argv = spark_class(env, "org.apache.spark.deploy.master.Master", "--host", "spark.lab",
                               "--port", str(SPARK_PORT), "--webui-port", str(SPARK_WEBUI_PORT))
            port = SPARK_PORT
        else:
            # Two cores each (the machine's own): when one worker dies, the other has room for
            # the executor each peer's application loses with it.
            argv = spark_class(env, "org.apache.spark.deploy.worker.Worker", "--host", f"{host}.lab",
                               "--cores", "2", "--memory", "1g", "--webui-port", str(WORKER_WEBUI_PORT),
                               "--work-dir", str(d / "work"), plan.spark_cluster_url)
            port = WORKER_WEBUI_PORT
        out.append(_launch(plan, host, name, argv, port))
    return out


# -- peers and the client -------------------------------------------------------------------------
def peer_command(plan: LabPlan, host: str) -> Launch:
    """The command and environment peer host ``host`` runs, as the deployment guide's systemd unit
    (``deploy/systemd/twinflow-peer@.service``) runs it: its ``ExecStart`` expanded with an
    environment file made from the guide's example (``peer.env.example``) with this lab's values
    (listening on 0.0.0.0:7070 of its namespace, advertising ``<host>.lab:7070``, mutual TLS and a
    token per scope, every secret by reference). The one seam for a peer's command."""
    unit = ServiceUnit.read(DEPLOY / "twinflow-peer@.service")
    env_file = plan.host_dir(host) / "twinflow-run" / f"{host}.env"
    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_text(peer_environment(plan, host))
    env = read_environment_file(env_file)
    return _launch(plan, host, "twinflow-run", unit.start_argv(host, env), PEER_PORT, env)


def peer_stop_command(plan: LabPlan, host: str, main_pid: int) -> list[str]:
    """The unit's ``ExecStop`` for peer ``host`` whose main process is ``main_pid``."""
    unit = ServiceUnit.read(DEPLOY / "twinflow-peer@.service")
    env = read_environment_file(plan.host_dir(host) / "twinflow-run" / f"{host}.env")
    argv = unit.stop_argv(host, env, main_pid)
    if argv is None:
        raise UnitError("the peer's unit has no ExecStop")
    return argv


def peer_environment(plan: LabPlan, host: str) -> str:
    """The guide's example environment file, every value this lab's (each key must be one the
    example has, so the example cannot lose one the lab needs)."""
    s = plan.secrets
    spark_conf = {} if plan.spark_master.startswith("local") else {
        **PEER_SPARK_CONF, "spark.executorEnv.TWINFLOW_REDIS_PASSWORD": f"file:{s / 'redis.pw'}"}
    values = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "FLOW": str(plan.flow_path),
        "TWINFLOW_REDIS": plan.redis_url, "TWINFLOW_REDIS_PASSWORD": f"file:{s / 'redis.pw'}",
        "TWINFLOW_ZK": plan.zk_hosts, "TWINFLOW_ZK_AUTH": f"file:{s / 'zk.auth'}",
        "LISTEN": f"0.0.0.0:{PEER_PORT}", "ADVERTISE": f"{host}.lab:{PEER_PORT}",
        "STATE_DIR": str(plan.host_dir(host) / "state"), "TLS_DIR": str(s), "TOKEN_DIR": str(s),
        "METRICS": "127.0.0.1:9464", "TWINFLOW_SPARK_MASTER": plan.spark_master, "TWINFLOW_START_FROM": "processed",
        # The driver binds, and tells executors, its host's address (the hostname resolves to it too).
        "SPARK_LOCAL_IP": plan.address(host), "PYSPARK_PYTHON": sys.executable,
        # And the operator console on its host, HTTPS with its certificate and tokens (lab_console.py).
        "EXTRA_ARGS": " ".join([*(f"--spark-conf {k}={v}" for k, v in spark_conf.items()),
                                f"--console-listen 0.0.0.0:{CONSOLE_PORT}"]),
    }
    example = read_environment_file(DEPLOY / "peer.env.example")
    if set(example) != set(values):
        raise UnitError(f"deploy/systemd/peer.env.example and the lab disagree on the settings: "
                       f"{sorted(set(example) ^ set(values))}")
    # A value with spaces in double quotes, as the example writes it: systemd (and
    # read_environment_file) take them off, and an operator's `. host.env` in sh reads it whole.
    return "".join(f'{k}="{v}"\n' if " " in v else f"{k}={v}\n" for k, v in values.items())


def operator_command(plan: LabPlan, args: list[str]) -> Launch:
    """``twinflow ARGS`` run by an operator on the client host: over the peers' mutual TLS with
    the client's own certificate (no peer's key) and the admin token, both named by the
    ``TWINFLOW_TLS_*`` and ``TWINFLOW_TOKEN`` variables, as an operator's shell would set them."""
    s = plan.secrets
    env = {"TWINFLOW_TLS_CERT": str(s / "client.pem"), "TWINFLOW_TLS_KEY": str(s / "client-key.pem"),
           "TWINFLOW_TLS_CA": str(s / "ca.pem"), "TWINFLOW_TOKEN": f"admin=file:{s / 'admin.token'}"}
    return _launch(plan, "client", "operator", [sys.executable, "-m", "twinflow.cli", *args], env=env)


def publisher_command(plan: LabPlan, count: int, rate: float, acked: str | Path, first: int = 0) -> Launch:
    """The client host publishing ``count`` messages of the chained flow at ``rate`` per second
    to both peers' advertised names over mutual TLS with the ingest token
    (:mod:`.lab_client`); each acknowledged message's ID is appended to ``acked``."""
    s = plan.secrets
    argv = [sys.executable, "-m", "twinflow_dev.lab_client", "--flow", plan.flow,
            *[a for p in plan.peer_addresses for a in ("--peer", p)],
            "--ca", str(s / "ca.pem"), "--cert", str(s / "client.pem"), "--key", str(s / "client-key.pem"),
            "--token", f"file:{s / 'ingest.token'}", "--count", str(count), "--rate", str(rate),
            "--first", str(first), "--acked", str(acked)]
    return _launch(plan, "client", "publisher", argv)
