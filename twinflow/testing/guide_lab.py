"""The deployment guide, run as written on three lab hosts named as it names its machines.

:meth:`GuideLab.up` makes three network namespaces, ``host-a``, ``host-b`` and ``host-c``, each
knowing the others as ``host-X.example`` in its own ``/etc/hosts`` (:mod:`.lab_network`), then
runs the blocks of ``docs/operations/deploy.md`` that the guide marks for the lab
(:mod:`.guide_blocks`), in the guide's order, up to its day-2 sections: the installation (the
packages, the ``twinflow`` user, a virtual environment per host with the wheel built from this
checkout), the certificates, the Redis, Sentinel and ZooKeeper files, the servers, the
secrets, the unit and environment file, ``systemctl enable --now``, ``twinflow status
--wait-streaming``, and the first message published and read back from the sink. The day-2
sections' blocks are run by the drills (:meth:`run_blocks`).

What the lab does that a machine's owner does by hand: it copies the files the guide says to
copy between machines (:meth:`_copy_secrets`, and the ``copy`` blocks), answers the guide's
placeholders (addresses, machine numbers, the passwords), keeps each host's own directories
under ``<dir>/hosts/<host>/root`` and mounts them over the real paths for everything that runs
on the host (:meth:`on_host`: the hosts share one disk; a machine without those paths gets
empty mount points, removed by :meth:`down`; the directories Debian's packages make start as
this machine's, their owner, mode and files), and, having no init system, runs ``systemctl``
itself (:meth:`systemctl`): the unit named, the one the guide installed in the host's
``/etc/systemd/system`` or else the package's in ``/lib/systemd/system`` (Redis's, Sentinel's,
Prometheus's), through :class:`.systemd_unit.ServiceUnit`, as the unit's ``User=``
(``setpriv``), with its environment files; ``enable`` is remembered, so a host that comes back
starts what was enabled on it (:meth:`come_back`). A ``Type=notify`` unit's start returns once
its server answers (systemd waits for its ready notice), another's at once. ``journalctl``
lines are not run. The commands themselves run as written, by ``sh -e``; a variable a block
exports is seen by its lines after a ``systemctl`` line.

What root reads or runs on a host must not be the service user's to change
(:meth:`ownership_problems`: every file under ``/etc/twinflow``, ``/etc/systemd/system`` and
``/opt/twinflow`` owned by root, and not writable by the ``twinflow`` group or others); the lab
checks it once the guide's first day ran and after every drill.

A fourth host, ``host-d.example``, starts with nothing installed: the machine the guide's
topology sections add (a peer ``peer-c``, a ZooKeeper server, a Redis replica).

The ``twinflow`` user the guide adds is made on this machine if it has none, and removed by
:meth:`down` when the lab made it.

Under failure: a block that exits non-zero raises :class:`~.lab.LabError` with the guide's
line, the host and the block's output, after the lab is taken down (``up``) or with the lab
left as it is (a drill's :meth:`run_blocks`: the drill's ``down`` follows). Every wait has a
deadline.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import re
import secrets as random_secrets
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import redis

from .guide_blocks import FROM_PACKAGES, ROOTED, GuideBlock, GuideError, GuideHost, read_guide
from .lab import Lab, LabError, _NetnsHttp, redis_in
from .lab_hosts import Launch, base_env
from .lab_network import LabProcess, LabState, check_usable, create, netns_exec, ns_inode
from .messages import CHAINED
from .systemd_unit import ServiceUnit, UnitError, read_environment_file

REPO = Path(__file__).resolve().parents[2]
GUIDE_PREFIX = "tfguide-"
GUIDE_SUBNET = "10.213.48.0/24"
HOSTS = {"host-a": (11, "peer-a"), "host-b": (12, "peer-b"), "host-c": (13, None), "host-d": (14, "peer-c")}
PEER_HOSTS = {"peer-a": "host-a", "peer-b": "host-b", "peer-c": "host-d"}
FIRST_PEERS = ("peer-a", "peer-b")  # the guide's first day; its topology sections add and remove more
DAY_TWO = "Upgrading twinflow"  # the first section the drills run, not `up`
SERVICE = "twinflow"            # the Sentinels' name for the primary (the guide's sentinel.conf)
USER = "twinflow"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVER_DEADLINE_S = 90.0
PEER_DEADLINE_S = 180.0
REDIS_FAILOVER_S = 30.0  # the lab's reads wait this long for the Sentinels to name a new primary
BLOCK_TIMEOUT_S = {"install": 1200.0, "run": 600.0}
# The servers of a `serve` line, by what the line runs.
SERVER_NAMES = (("--sentinel", "sentinel"), ("redis.conf", "redis"), ("QuorumPeerMain", "zookeeper"),
                ("deploy.master.Master", "spark-master"), ("deploy.worker.Worker", "spark-worker"))
# The units the guide starts with systemctl: the server each runs (its name in the lab) and port.
UNIT_SERVERS = {"redis-server": ("redis", 6379), "redis-sentinel": ("sentinel", 26379),
                "twinflow-zookeeper": ("zookeeper", 2181), "prometheus": ("prometheus", 9090),
                "twinflow-spark-master": ("spark-master", 7077), "twinflow-spark-worker": ("spark-worker", 8081)}
SYSTEM_UNITS = Path("/lib/systemd/system")  # the packages' own units: the same on every machine
# What root reads or runs on a guide machine (ownership_problems).
ROOT_READS = ("/etc/twinflow", "/etc/systemd/system", "/opt/twinflow")


class GuideLab(Lab):
    """The guide's three machines in ``directory`` (see module)."""

    def __init__(self, directory: str | Path, prefix: str = GUIDE_PREFIX, subnet: str = GUIDE_SUBNET,
                 flow: str = "guide", guide: str | Path | None = None):
        self.directory = Path(directory).resolve()
        self._guide = guide
        state = LabState(prefix=prefix, subnet=subnet, domain="example", info={"form": "guide", "flow": flow})
        self.plan = SimpleNamespace(flow_path=self.dist / "flow.yaml", shards=1, flow=flow, short=False)
        self.plan.state = state
        self._children: dict[int, subprocess.Popen] = {}
        self._flow = None
        self._started: list[LabProcess] = []  # servers a block's systemctl lines started, to wait for
        # The first day waits for the servers a block started (an operator checks them before going
        # on); later sections say how to wait in their own commands (a new ZooKeeper server answers
        # only once the others know it).
        self._wait_started = False

    @property
    def dist(self) -> Path:
        """Where the blocks run (their working directory): the wheel, the flow file, ``deploy/``."""
        return self.directory / "dist"

    @classmethod
    def load(cls, directory: str | Path) -> "GuideLab":
        lab = cls(directory)
        lab.plan.state = LabState.load(lab.state_path)
        return lab

    def peer_ids(self) -> tuple[str, ...]:
        """The flow's peers: the guide's two, and those its topology sections added since."""
        return tuple(self.state.info.get("peers", FIRST_PEERS))

    def host(self, name: str) -> GuideHost:
        number, peer = HOSTS[name]
        return GuideHost(name, self.state.host(name).address, list(HOSTS).index(name) + 1, peer,
                         str(self.directory / "hosts" / name / "root"))

    @property
    def client_ns(self) -> str:
        return self.state.host("host-c").ns

    def blocks(self) -> list[GuideBlock]:
        return read_guide(self._guide) if self._guide else read_guide()

    # -- up -----------------------------------------------------------------------------------
    def up(self, say: Callable[[str], None] = lambda text: None) -> "GuideLab":
        """Make the hosts and run the guide's day-1 blocks (see module); return once the first
        message came back from the sink."""
        check_usable(self.state.prefix)
        if self.state_path.exists():
            raise LabError(f"a lab is already recorded in {self.state_path} (twinflow lab down --dir {self.directory})")
        self._check_traversable()
        for name, (octet, _) in HOSTS.items():
            self.state.add_host(name, octet)
        taken = [h.ns for h in self.state.hosts if ns_inode(h.ns) is not None]
        if taken or ns_inode(self.state.hub) is not None:
            raise LabError(f"{', '.join(taken) or self.state.hub} exist already: another lab uses the prefix "
                           f"{self.state.prefix!r}")
        shutil.rmtree(self.directory / "hosts", ignore_errors=True)
        t0 = time.monotonic()
        try:
            self.state.info["made_user"] = _user_exists(USER) is False
            create(self.state, self.state_path)
            self._prepare()
            say(f"network: {len(HOSTS)} hosts named host-X.example on {self.state.subnet} ({time.monotonic() - t0:.1f} s)")
            self._wait_started = True
            for block in self.blocks():
                if block.section == DAY_TWO:
                    break
                self.run_block(block, say=say)
                if block.kind == "install":
                    self._as_installed()
            self._wait_started = False
            problems = self.ownership_problems()
            if problems:
                raise LabError("files root reads or runs that the service user could change:\n" + "\n".join(problems))
            self.state.info["up_s"] = round(time.monotonic() - t0, 1)
            self.save()
            say(f"the guide ran to its first message ({self.state.info['up_s']} s)")
        except BaseException:
            self.down()
            raise
        return self

    def _check_traversable(self) -> None:
        """The ``twinflow`` user must reach the lab's files (its peers run as that user)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for d in [self.directory, *self.directory.parents]:
            if not os.stat(d).st_mode & 0o001:
                raise LabError(f"{d} is not searchable by other users (mode {oct(os.stat(d).st_mode & 0o777)}): "
                               f"the guide's peers run as the {USER} user; put the lab elsewhere (--dir)")

    def _prepare(self) -> None:
        """The blocks' working directory (a wheel of this checkout, the flow file, ``deploy/``)
        and each host's root with the directories a Debian machine has; the passwords."""
        self.dist.mkdir(parents=True, exist_ok=True)
        for old in self.dist.glob("twinflow-*.whl"):
            old.unlink()
        build_wheel(self.dist)
        shutil.copytree(REPO / "deploy", self.dist / "deploy", dirs_exist_ok=True)
        self.plan.flow_path.write_text(guide_flow(self.plan.flow))
        for name in HOSTS:
            root = Path(self.host(name).root)
            for d in ROOTED:
                (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for d in [root, *root.rglob("*")]:
                d.chmod(0o755)
        # The real paths each host's own are mounted over: a machine without them gets empty
        # directories, removed again by `down`.
        for d in ROOTED:
            if not os.path.isdir(d):
                os.makedirs(d)
                self.state.info.setdefault("mount_points", []).append(d)
                self.save()
        self._as_installed()
        secrets = self.directory / "secrets.env"
        if not secrets.exists():
            secrets.write_text(f"password={random_secrets.token_urlsafe(24)}\n"
                               f"zookeeper password={random_secrets.token_urlsafe(18)}\n")
            secrets.chmod(0o600)

    def _as_installed(self) -> None:
        """Each host's directories that Debian's packages make (:data:`FROM_PACKAGES`) as this
        machine has them once installed: the owner and mode of each directory, and each file
        the host does not have yet (Debian's ``redis.conf`` is ``redis:redis`` 0640 in a
        ``redis:redis`` 2770 directory, say)."""
        for name in HOSTS:
            root = Path(self.host(name).root)
            for top in FROM_PACKAGES:
                if not os.path.isdir(top) or os.path.ismount(top):
                    continue
                for real in [Path(top), *sorted(Path(top).rglob("*"))]:
                    mine = root / str(real).lstrip("/")
                    st = real.lstat()
                    # Links left out: an absolute one (Debian's /etc/zookeeper/conf, through
                    # /etc/alternatives) would lead the lab's writes out of the host's own files.
                    if stat.S_ISDIR(st.st_mode):
                        mine.mkdir(parents=True, exist_ok=True)
                    elif stat.S_ISREG(st.st_mode) and top.startswith("/etc/") and not os.path.lexists(mine):
                        if not mine.parent.is_dir():
                            continue
                        shutil.copyfile(real, mine)
                    else:
                        continue
                    os.chown(mine, st.st_uid, st.st_gid)
                    mine.chmod(stat.S_IMODE(st.st_mode))

    def ownership_problems(self) -> list[str]:
        """Each file or directory root reads or runs on a host (:data:`ROOT_READS`) that the
        service user could change: owned by it, or writable by its group or by anyone."""
        try:
            user = pwd.getpwnam(USER)
        except KeyError:
            return []
        problems = []
        for name in HOSTS:
            root = Path(self.host(name).root)
            for top in ROOT_READS:
                base = root / top.lstrip("/")
                if not base.exists():
                    continue
                for path in [base, *base.rglob("*")]:
                    st = path.lstat()
                    if stat.S_ISLNK(st.st_mode):
                        continue
                    mode = stat.S_IMODE(st.st_mode)
                    if st.st_uid == user.pw_uid or mode & 0o002 or (st.st_gid == user.pw_gid and mode & 0o020):
                        problems.append(f"{name}: /{path.relative_to(root)} is uid {st.st_uid} gid {st.st_gid} "
                                        f"mode {mode:04o}")
                    if len(problems) > 20:
                        return problems
        return problems

    def secrets(self) -> dict[str, str]:
        lines = (self.directory / "secrets.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def answers_for(self, text: str) -> dict[str, str]:
        """What the lab answers for the placeholders of ``text``: the passwords, and the version
        the peers run (``twinflow status --json`` shows it to an operator)."""
        answers = self.secrets()
        if "<the peers' version>" in text:
            versions = {r.get("version") for r in self.peer_statuses().values() if r.get("version")}
            if len(versions) != 1:
                raise LabError(f"the peers run versions {versions or 'none'}: no one version to install")
            answers["the peers' version"] = versions.pop()
        return answers

    # -- running a block ----------------------------------------------------------------------
    def run_block(self, block: GuideBlock, hosts: list[str] | None = None,
                  say: Callable[[str], None] = lambda text: None) -> list[str]:
        """Run ``block`` on each of its hosts (those of ``hosts`` only, when given); the output of
        each host's run."""
        outputs, servers = [], []
        for name in [h for h in block.hosts if hosts is None or h in hosts]:
            host = self.host(name)
            text, path = block.text, block.path
            if "as-peer" in block.flags:
                text, path = host.as_peer(text), host.as_peer(path) if path else None
            text = host.fill(text, self.answers_for(text))
            t0 = time.monotonic()
            if block.kind in ("file", "append"):
                target = host.path(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "a" if block.kind == "append" else "w") as f:
                    f.write(text)
                out = ""
            elif block.kind == "copy":  # from the block's first host to each other
                if name == block.hosts[0]:
                    continue
                out = self._copy(self.host(block.hosts[0]), host, _lines(text))
            elif block.kind == "serve":  # every host's first, then the wait (an ensemble needs its quorum)
                started = [self._start(self._server_launch(name, line)) for line in _lines(text)]
                servers += started
                out = " ".join(p.name for p in started)
            else:
                out = self._run_commands(block, host, text)
                servers += self._started if self._wait_started else []
                self._started = []
            outputs.append(out)
            say(f"  deploy.md line {block.line} ({block.section}, {block.kind}) on {name}: "
                f"{time.monotonic() - t0:.1f} s")
        if servers:
            t0 = time.monotonic()
            self._wait_servers(servers, t0 + SERVER_DEADLINE_S)
            say(f"  deploy.md line {block.line}: {len(servers)} servers answering ({time.monotonic() - t0:.1f} s)")
        if block.section == "Certificates and tokens" and block.kind == "run" and "host-c" in block.hosts:
            self._copy_secrets()
        return outputs

    def _run_commands(self, block: GuideBlock, host: GuideHost, text: str) -> str:
        """A shell block, its ``systemctl`` lines done by the lab, the rest run by ``sh -e`` in one
        go between them, each part starting with the environment the one before ended with (a
        variable a line exports is seen by the lines after a ``systemctl``)."""
        out, chunk = [], []
        env = {"PATH": ROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
        for line in _lines(text) + [None]:
            words = shlex.split(line) if line else []
            if line is not None and words[0] not in ("systemctl", "journalctl"):
                chunk.append(line)
                continue
            if chunk:
                text_out, env = self._shell(block, host, "\n".join(chunk), env)
                out.append(text_out)
                chunk = []
            if words and words[0] == "systemctl":
                self.systemctl(host.name, words[1:])
        return "".join(out)

    def on_host(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` with ``host``'s own directories (:data:`ROOTED`) mounted over the real ones, in a
        mount namespace of its own (``unshare`` and ``sh`` exec() it: the PID is the program's)."""
        root = self.host(host).root
        binds = " && ".join(f"mount --bind {shlex.quote(root + d)} {shlex.quote(d)}" for d in ROOTED)
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", binds + ' && exec "$@"', "sh", *argv]

    def _shell(self, block: GuideBlock, host: GuideHost, script: str, env: dict[str, str]) -> tuple[str, dict]:
        """``script`` run by ``sh -e`` with ``env``; its output and the environment it ended with."""
        ended = self.directory / "hosts" / host.name / "block.env"
        ended.parent.mkdir(parents=True, exist_ok=True)
        ended.unlink(missing_ok=True)
        argv = self.on_host(host.name, ["sh", "-e", "-c", f"{script}\nenv -0 > {shlex.quote(str(ended))}"])
        if block.kind == "run":  # inside the host; `install` fetches packages through this machine's network
            argv = netns_exec(self.state.host(host.name).ns, argv)
        done = subprocess.run(argv, cwd=self.dist, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S[block.kind], stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LabError(f"deploy.md line {block.line} ({block.section}) failed on {host.name} with exit "
                           f"{done.returncode}:\n{script}\n--- output ---\n{(done.stdout + done.stderr)[-4000:]}")
        pairs = [item.split("=", 1) for item in ended.read_text().split("\0") if "=" in item]
        return done.stdout, {k: v for k, v in pairs if k not in ("PWD", "OLDPWD", "SHLVL", "_")}

    def _copy(self, source: GuideHost, target: GuideHost, paths: list[str]) -> str:
        """Each of ``paths`` from ``source`` to ``target``, its owner and mode kept."""
        for path in paths:
            a, b = source.path(path), target.path(path)
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)
            st = a.stat()
            os.chown(b, st.st_uid, st.st_gid)
        return f"copied {len(paths)} files from {source.name} to {target.name}"

    def blocks_of(self, section: str, subsection: str | None = None) -> list[GuideBlock]:
        """The blocks of ``section`` (and ``subsection``, when given), in the guide's order."""
        found = [b for b in self.blocks() if b.section == section and subsection in (None, b.subsection)]
        if not found:
            raise GuideError(f"the guide has no lab block under {section!r}" + (f" / {subsection!r}" if subsection else ""))
        return found

    def run_blocks(self, section: str, subsection: str | None = None, hosts: list[str] | None = None,
                   say: Callable[[str], None] = lambda text: None) -> list[str]:
        """Run the blocks of ``section`` (``subsection``) in order; their outputs."""
        return [out for b in self.blocks_of(section, subsection) for out in self.run_block(b, hosts, say)]

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

    def _copy_secrets(self, peers: tuple[str, ...] = FIRST_PEERS) -> None:
        """What the guide says to copy from host-c: the CA, each peer's certificate and key, the
        tokens; owned by root, group twinflow, the keys and tokens mode 0640, the rest 0644."""
        made = Path(self.host("host-c").root) / "etc/twinflow/tls"
        group = pwd.getpwnam(USER).pw_gid
        for peer in peers:
            root = Path(self.host(PEER_HOSTS[peer]).root)
            copies = [(made / f, root / "etc/twinflow/tls" / f) for f in ("ca.pem", f"{peer}.pem", f"{peer}-key.pem")]
            copies += [(made / f"{s}.token", root / "etc/twinflow/tokens" / f"{s}.token")
                       for s in ("ingest", "escalation", "admin")]
            for source, target in copies:
                shutil.copyfile(source, target)
                os.chown(target, 0, group)
                target.chmod(0o644 if target.name in ("ca.pem", f"{peer}.pem") else 0o640)

    # -- servers --------------------------------------------------------------------------------
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
        if any(p.name == "sentinel" for p in servers) and len(self._hosts_running("redis-sentinel")) >= 3:
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

    def _zk_mode_or_none(self, host: str) -> str | None:
        """The mode of ``host``'s ZooKeeper server (None when none answers)."""
        try:
            return self._zk_mode(self.state.host(host).address)
        except OSError:
            return None

    def _hosts_running(self, unit: str) -> list[str]:
        """The hosts with ``unit`` enabled."""
        return [h for h, units in self.state.info.get("enabled", {}).items() if unit in units]

    def _sentinels_ready(self) -> bool:
        replicas = len(self._hosts_running("redis-server")) - 1
        return all(self._sentinel_agrees(self.state.host(name).address, 26379, SERVICE, replicas=replicas)
                   for name in self._hosts_running("redis-sentinel"))

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

    # -- systemctl --------------------------------------------------------------------------------
    def systemctl(self, host: str, args: list[str]) -> None:
        """``systemctl ARGS`` on ``host`` (see module): daemon-reload; enable, disable (each with
        ``--now`` or not), start, stop and restart of one or more units."""
        words = [a for a in args if not a.startswith("-")]
        now = "--now" in args
        if words == ["daemon-reload"]:
            return
        verbs = ("enable", "disable", "start", "stop", "restart")
        if len(words) < 2 or words[0] not in verbs or set(args) - set(words) - {"--now", "--quiet"}:
            raise GuideError(f"systemctl {' '.join(args)}: the lab runs daemon-reload, and {', '.join(verbs)} "
                             f"of named units (enable and disable with --now or not)")
        verb = words[0]
        enabled = self.state.info.setdefault("enabled", {}).setdefault(host, [])
        for unit in words[1:]:
            name = unit.removesuffix(".service")
            self._unit(host, name)  # a unit the host has, or GuideError
            if verb == "enable" and name not in enabled:
                enabled.append(name)
            if verb == "disable" and name in enabled:
                enabled.remove(name)
            peer = _peer_of_unit(name)
            if peer and verb == "enable" and peer not in self.peer_ids():
                self.state.info["peers"] = [*self.peer_ids(), peer]
            if peer and verb == "disable":
                self.state.info["peers"] = [p for p in self.peer_ids() if p != peer]
            self.save()
            if verb in ("stop", "restart") or (verb == "disable" and now):
                self.stop_unit(host, name)
            if verb in ("start", "restart") or (verb == "enable" and now):
                self.start_unit(host, name)

    def _unit(self, host: str, name: str) -> tuple[ServiceUnit, str]:
        """The unit ``name`` (``twinflow-peer@peer-a``, ``redis-server``) as ``host`` has it: the one
        installed in its ``/etc/systemd/system``, else the package's; and its instance."""
        base, at, instance = name.partition("@")
        file = f"{base}@.service" if at else f"{name}.service"
        for path in (Path(self.host(host).root) / "etc/systemd/system" / file, SYSTEM_UNITS / file):
            if path.exists():
                return ServiceUnit.read(path), instance
        raise GuideError(f"systemctl: {host} has no unit {file} (in /etc/systemd/system or {SYSTEM_UNITS})")

    def _unit_env(self, host: str, unit: ServiceUnit, instance: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for path in unit.env_file_paths(instance):
            optional, path = path.startswith("-"), path.lstrip("-")
            where = self.host(host).path(path) if any(path.startswith(d + "/") for d in ROOTED) else Path(path)
            if optional and not where.exists():
                continue
            env.update(read_environment_file(where))
        return env

    @staticmethod
    def _process_name(name: str) -> tuple[str, int]:
        if _peer_of_unit(name):
            return name, 7070
        return UNIT_SERVERS.get(name, (name, 0))

    def start_unit(self, host: str, name: str, env: dict[str, str] | None = None) -> LabProcess:
        """``systemctl start NAME`` on ``host``: the unit's ``ExecStart``, as its ``User=``, with its
        environment files; returns at once, or once it answers for a ``Type=notify`` unit."""
        unit, instance = self._unit(host, name)
        unit_env = self._unit_env(host, unit, instance)
        try:
            argv = unit.start_argv(instance, unit_env)
        except UnitError as exc:
            raise GuideError(f"{name} on {host}: {exc}") from exc
        run_env = {**base_env(), "PATH": ROOT_PATH, **unit.environment, **unit_env, **(env or {})}
        if unit.user:
            account = pwd.getpwnam(unit.user)
            run_env.update(HOME=account.pw_dir, USER=unit.user, LOGNAME=unit.user)
            argv = ["setpriv", f"--reuid={unit.user}", f"--regid={unit.group or account.pw_gid}", "--init-groups",
                    *argv]
        argv = self.on_host(host, argv)
        process, port = self._process_name(name)
        d = self.directory / "hosts" / host / process
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o777)  # its working directory, written by the service user (Spark's files)
        p = self._start(Launch(host, process, argv, run_env, str(d), str(d / f"{process}.log"), port))
        if unit.type == "notify":  # systemd's start waits for the server's ready notice
            self._wait(f"{process} answering on {host}", lambda: self.answers(p),
                       time.monotonic() + SERVER_DEADLINE_S, [p])
        if not _peer_of_unit(name):  # waited for (again) once the block ran on every host
            self._started.append(p)
        return p

    def stop_unit(self, host: str, name: str, deadline_s: float | None = None) -> int | None:
        """``systemctl stop NAME`` on ``host``: the unit's ``ExecStop`` (a master hands over), or its
        kill signal, then SIGKILL after ``TimeoutStopSec``; the exit status (None: not running)."""
        process, _ = self._process_name(name)
        try:
            p = self.process(host, process)
        except LabError:
            return None
        if not self.alive(p):
            return self.wait_exit(p, 0)
        unit, instance = self._unit(host, name)
        argv = unit.stop_argv(instance, self._unit_env(host, unit, instance), p.pid)
        if argv is None:
            argv = ["kill", "-s", unit.kill_signal.removeprefix("SIG"), str(p.pid)]
        return self._stop_unit(p, argv, deadline_s or unit.timeout_stop_s)

    def start_peer(self, peer: str, env: dict[str, str] | None = None) -> LabProcess:
        """``systemctl start twinflow-peer@PEER``: the installed unit's ``ExecStart``, as its
        ``User=``, with its environment file; returns at once."""
        return self.start_unit(PEER_HOSTS[peer], f"twinflow-peer@{peer}", env)

    def stop_peer(self, peer: str, deadline_s: float | None = None) -> int | None:
        """``systemctl stop twinflow-peer@PEER``: the unit's ``ExecStop`` (a master hands over),
        SIGKILL after ``TimeoutStopSec``; the exit status (None: it was not running)."""
        return self.stop_unit(PEER_HOSTS[peer], f"twinflow-peer@{peer}", deadline_s)

    def wait_streaming(self, peer: str, deadline_s: float = PEER_DEADLINE_S) -> None:
        p = self.process(PEER_HOSTS[peer], f"twinflow-peer@{peer}")
        self._wait(f"{peer} streaming", lambda: (lambda r: r.get("streaming") == "1" and r.get("pid") == str(p.pid))(
            self.peer_statuses().get(peer, {})), time.monotonic() + deadline_s, [p])

    def peer_of(self, p: LabProcess) -> str | None:
        return p.name.split("@", 1)[1] if p.name.startswith("twinflow-peer@") else None

    # -- the client -----------------------------------------------------------------------------
    def publisher(self, count: int, rate: float, acked: str | Path, first: int = 0) -> LabProcess:
        """host-c publishing the chained flow's messages to both peers, with the client
        certificate and ingest token the guide left there (:mod:`.lab_client`)."""
        tls = Path(self.host("host-c").root) / "etc/twinflow/tls"
        argv = [sys.executable, "-m", "twinflow.testing.lab_client", "--flow", self.plan.flow,
                "--peer", "host-a.example:7070", "--peer", "host-b.example:7070",
                "--ca", str(tls / "ca.pem"), "--cert", str(tls / "client.pem"), "--key", str(tls / "client-key.pem"),
                "--token", f"file:{tls / 'ingest.token'}", "--count", str(count), "--rate", str(rate),
                "--first", str(first), "--acked", str(acked)]
        d = self.directory / "hosts" / "host-c" / "publisher"
        return self._start(Launch("host-c", "publisher", argv, base_env(), str(d), str(d / "publisher.log")))

    def come_back(self, host: str) -> None:
        """``host`` starts again after a crash, as a machine booting does: the units enabled on
        it, its servers first (on the data they left), then its peer, streaming again."""
        units = self.state.info.get("enabled", {}).get(host, [])
        servers = [self.start_unit(host, u) for u in units if not _peer_of_unit(u)]
        self._started = []
        self._wait_servers(servers, time.monotonic() + SERVER_DEADLINE_S)
        for unit in units:
            peer = _peer_of_unit(unit)
            if peer:
                self.start_peer(peer)
                self.wait_streaming(peer)

    # -- down -----------------------------------------------------------------------------------
    def down(self) -> list[str]:
        done = super().down()
        for d in reversed(self.state.info.pop("mount_points", [])):
            try:
                os.rmdir(d)
                done.append(f"removed the mount point {d}")
            except OSError:
                pass
        if self.state.info.get("made_user") and _user_exists(USER):
            subprocess.run(["userdel", USER], capture_output=True, timeout=30)
            done.append(f"removed the user {USER}")
        return done


def _peer_of_unit(name: str) -> str | None:
    m = re.fullmatch(r"twinflow-peer@([\w.-]+)", name)
    return m.group(1) if m else None


def _lines(text: str) -> list[str]:
    return [s for s in (raw.strip() for raw in text.splitlines()) if s and not s.startswith("#")]


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def build_wheel(out: Path, version: str | None = None) -> Path:
    """A wheel of this checkout in ``out`` (``pip wheel --no-deps .``), of ``version`` when given
    (a copy of the checkout with that version: what an upgrade installs)."""
    source = REPO
    if version is not None:
        source = out / f"src-{version}"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", ".twinflow", "*.egg-info",
                                                                     "__pycache__", "build", "site"))
        init = source / "twinflow" / "__init__.py"
        init.write_text(re.sub(r'(?m)^__version__ = ".*"$', f'__version__ = "{version}"', init.read_text()))
        project = source / "pyproject.toml"
        project.write_text(re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', project.read_text()))
    before = set(out.glob("twinflow-*.whl"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise LabError(f"pip wheel failed:\n{done.stderr[-3000:]}")
    made = sorted(set(out.glob("twinflow-*.whl")) - before) or sorted(out.glob("twinflow-*.whl"))
    return made[-1]


def guide_flow(name: str) -> str:
    """The lab's flow file: the chained example under ``name``, every step acknowledged by a
    replica (``wait_replicas: 1``), as the guide's layout asks."""
    text = re.sub(r"(?m)^flow: .*$", f"flow: {name}", CHAINED.read_text(), count=1)
    return re.sub(r"(?m)^cluster: \{(.*)\}$", r"cluster: {\1, wait_replicas: 1}", text, count=1)
