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
empty mount points, removed by :meth:`down`), and, having no init system, runs ``systemctl``
itself (:meth:`systemctl`): the unit file the guide installed, through
:class:`.systemd_unit.ServiceUnit`, as the unit's ``User=`` (``setpriv``), with the environment
file the guide wrote. ``journalctl`` lines are not run. The commands themselves run as written,
by ``sh -e``; a variable a block exports is seen by its lines after a ``systemctl`` line.

The ``twinflow`` user the guide adds is made on this machine if it has none, and removed by
:meth:`down` when the lab made it.

Under failure: a block that exits non-zero raises :class:`~.lab.LabError` with the guide's
line, the host and the block's output, after the lab is taken down (``up``) or with the lab
left as it is (a drill's :meth:`run_blocks`: the drill's ``down`` follows). Every wait has a
deadline.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets as random_secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import redis

from .guide_blocks import ROOTED, GuideBlock, GuideError, GuideHost, read_guide
from .lab import Lab, LabError, redis_in
from .lab_hosts import Launch, base_env
from .lab_network import LabProcess, LabState, check_usable, create, netns_exec, ns_inode
from .messages import CHAINED
from .systemd_unit import ServiceUnit, read_environment_file

REPO = Path(__file__).resolve().parents[2]
GUIDE_PREFIX = "tfguide-"
GUIDE_SUBNET = "10.213.48.0/24"
HOSTS = {"host-a": (11, "peer-a"), "host-b": (12, "peer-b"), "host-c": (13, None)}
PEER_HOSTS = {"peer-a": "host-a", "peer-b": "host-b"}
DAY_TWO = "Upgrading twinflow"  # the first section the drills run, not `up`
SERVICE = "twinflow"            # the Sentinels' name for the primary (the guide's sentinel.conf)
USER = "twinflow"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVER_DEADLINE_S = 90.0
PEER_DEADLINE_S = 180.0
BLOCK_TIMEOUT_S = {"install": 1200.0, "run": 600.0}
# The servers of a `serve` line, by what the line runs.
SERVER_NAMES = (("--sentinel", "sentinel"), ("redis.conf", "redis"), ("QuorumPeerMain", "zookeeper"),
                ("deploy.master.Master", "spark-master"), ("deploy.worker.Worker", "spark-worker"))


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

    @property
    def dist(self) -> Path:
        """Where the blocks run (their working directory): the wheel, the flow file, ``deploy/``."""
        return self.directory / "dist"

    @classmethod
    def load(cls, directory: str | Path) -> "GuideLab":
        lab = cls(directory)
        lab.plan.state = LabState.load(lab.state_path)
        return lab

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
            say(f"network: 3 hosts named host-X.example on {self.state.subnet} ({time.monotonic() - t0:.1f} s)")
            for block in self.blocks():
                if block.section == DAY_TWO:
                    break
                self.run_block(block, say=say)
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
        secrets = self.directory / "secrets.env"
        if not secrets.exists():
            secrets.write_text(f"password={random_secrets.token_urlsafe(24)}\n"
                               f"zookeeper password={random_secrets.token_urlsafe(18)}\n")
            secrets.chmod(0o600)

    def secrets(self) -> dict[str, str]:
        lines = (self.directory / "secrets.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

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
            text = host.fill(text, self.secrets())
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
            outputs.append(out)
            say(f"  deploy.md line {block.line} ({block.section}, {block.kind}) on {name}: "
                f"{time.monotonic() - t0:.1f} s")
        if servers:
            t0 = time.monotonic()
            self._wait_servers(servers, t0 + SERVER_DEADLINE_S)
            say(f"  deploy.md line {block.line}: {len(servers)} servers answering ({time.monotonic() - t0:.1f} s)")
        if block.section == "Certificates and tokens" and block.kind == "run":
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

    def _copy_secrets(self) -> None:
        """What the guide says to copy from host-c: the CA, each peer's certificate and key, the
        tokens; owned by the service user, mode 0600."""
        made = Path(self.host("host-c").root) / "etc/twinflow/tls"
        user = pwd.getpwnam(USER)
        for peer, name in PEER_HOSTS.items():
            root = Path(self.host(name).root)
            copies = [(made / f, root / "etc/twinflow/tls" / f) for f in ("ca.pem", f"{peer}.pem", f"{peer}-key.pem")]
            copies += [(made / f"{s}.token", root / "etc/twinflow/tokens" / f"{s}.token")
                       for s in ("ingest", "escalation", "admin")]
            for source, target in copies:
                shutil.copyfile(source, target)
                os.chown(target, user.pw_uid, user.pw_gid)
                target.chmod(0o600)

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
        if any(p.name == "sentinel" and p.host == "host-c" for p in servers):
            self._wait("the Sentinels agreeing on the primary and two replicas", self._sentinels_ready, end, servers)

    def _spark_address(self) -> str:
        return self.state.host("host-c").address

    def _sentinels_ready(self) -> bool:
        return all(self._sentinel_agrees(self.state.host(name).address, 26379, SERVICE, replicas=2) for name in HOSTS)

    def address_of(self, name: str) -> str:
        """A lab host's address by any of its names (``host-a.example``, ``host-a``, an address)."""
        short = name.split(".", 1)[0]
        return self.state.host(short).address if short in HOSTS else name

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

    # -- peers: systemctl -----------------------------------------------------------------------
    def systemctl(self, host: str, args: list[str]) -> None:
        """``systemctl ARGS`` on ``host``, for the guide's peer unit (see module)."""
        if args == ["daemon-reload"]:
            return
        verb, unit = args[0], args[-1]
        m = re.fullmatch(r"twinflow-peer@([\w.-]+)", unit)
        if m is None or verb not in ("enable", "start", "stop", "restart") or (verb == "enable" and "--now" not in args):
            raise GuideError(f"systemctl {' '.join(args)}: the lab runs daemon-reload, enable --now, start, stop "
                             f"and restart of twinflow-peer@PEER")
        peer = m.group(1)
        if verb in ("stop", "restart"):
            self.stop_peer(peer)
        if verb != "stop":
            self.start_peer(peer)

    def _unit(self, host: str) -> ServiceUnit:
        """The peer unit the guide installed on ``host``."""
        return ServiceUnit.read(Path(self.host(host).root) / "etc/systemd/system/twinflow-peer@.service")

    def _unit_env(self, host: str, unit: ServiceUnit, peer: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for path in unit.env_file_paths(peer):
            env.update(read_environment_file(self.host(host).path(path)))
        return env

    def start_peer(self, peer: str, env: dict[str, str] | None = None) -> LabProcess:
        """``systemctl start twinflow-peer@PEER``: the installed unit's ``ExecStart``, as its
        ``User=``, with its environment file; returns at once."""
        host = PEER_HOSTS[peer]
        unit = self._unit(host)
        unit_env = self._unit_env(host, unit, peer)
        argv = unit.start_argv(peer, unit_env)
        run_env = {**base_env(), "PATH": ROOT_PATH, **unit_env, **(env or {})}
        if unit.user:
            run_env.update(HOME=pwd.getpwnam(unit.user).pw_dir, USER=unit.user, LOGNAME=unit.user)
            argv = ["setpriv", f"--reuid={unit.user}", f"--regid={unit.group or unit.user}", "--init-groups", *argv]
        argv = self.on_host(host, argv)
        d = self.directory / "hosts" / host / f"twinflow-peer@{peer}"
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o777)  # its working directory, written by the service user (Spark's files)
        return self._start(Launch(host, f"twinflow-peer@{peer}", argv, run_env, str(d),
                                  str(d / f"twinflow-peer@{peer}.log"), 7070))

    def stop_peer(self, peer: str, deadline_s: float | None = None) -> int | None:
        """``systemctl stop twinflow-peer@PEER``: the unit's ``ExecStop`` (a master hands over),
        SIGKILL after ``TimeoutStopSec``; the exit status (None: it was not running)."""
        host = PEER_HOSTS[peer]
        try:
            p = self.process(host, f"twinflow-peer@{peer}")
        except LabError:
            return None
        if not self.alive(p):
            return self.wait_exit(p, 0)
        unit = self._unit(host)
        argv = unit.stop_argv(peer, self._unit_env(host, unit, peer), p.pid)
        return self._stop_unit(p, argv, deadline_s or unit.timeout_stop_s)

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
        """``host`` starts again after a crash, as a machine booting does: its servers (the
        guide's serve lines for it, on the data they left), then its peer."""
        for block in self.blocks():
            if block.kind == "serve" and host in block.hosts:
                self.run_block(block, [host])
        peer = HOSTS[host][1]
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
