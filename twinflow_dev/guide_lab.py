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

The lab's parts are mixed into :class:`GuideLab`: running the guide's blocks
(:mod:`.guide_block_runs`), ``systemctl`` and the units (:mod:`.guide_units`), the servers'
answers and the flow's Redis (:mod:`.guide_servers`); the hosts, the service user and the
deadlines are named in :mod:`.guide_hosts`.

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
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from .guide_block_runs import GuideBlockRuns
from .guide_blocks import FROM_PACKAGES, ROOTED, GuideBlock, GuideHost, read_guide
from .guide_hosts import FIRST_PEERS, HOSTS, USER
from .guide_servers import GuideServers
from .guide_units import GuideUnits
from .lab import Lab, LabError
from .lab_hosts import Launch, base_env
from .lab_network import LabProcess, LabState, check_usable, create, ns_inode
from twinflow.testing.messages import CHAINED

REPO = Path(__file__).resolve().parents[1]
GUIDE_PREFIX = "tfguide-"
GUIDE_SUBNET = "10.213.48.0/24"
DAY_TWO = "Upgrading twinflow"  # the first section the drills run, not `up`
# What root reads or runs on a guide machine (ownership_problems).
ROOT_READS = ("/etc/twinflow", "/etc/systemd/system", "/opt/twinflow")


class GuideLab(GuideBlockRuns, GuideUnits, GuideServers, Lab):
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

    # -- the client -----------------------------------------------------------------------------
    def publisher(self, count: int, rate: float, acked: str | Path, first: int = 0) -> LabProcess:
        """host-c publishing the chained flow's messages to both peers, with the client
        certificate and ingest token the guide left there (:mod:`.lab_client`)."""
        tls = Path(self.host("host-c").root) / "etc/twinflow/tls"
        argv = [sys.executable, "-m", "twinflow_dev.lab_client", "--flow", self.plan.flow,
                "--peer", "host-a.example:7070", "--peer", "host-b.example:7070",
                "--ca", str(tls / "ca.pem"), "--cert", str(tls / "client.pem"), "--key", str(tls / "client-key.pem"),
                "--token", f"file:{tls / 'ingest.token'}", "--count", str(count), "--rate", str(rate),
                "--first", str(first), "--acked", str(acked)]
        d = self.directory / "hosts" / "host-c" / "publisher"
        return self._start(Launch("host-c", "publisher", argv, base_env(), str(d), str(d / "publisher.log")))

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
