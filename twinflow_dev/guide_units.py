"""``systemctl`` on a guide lab host, as the lab runs it without an init system (mixed into
:class:`~.guide_lab.GuideLab`): the unit named, the one the guide installed in the host's
``/etc/systemd/system`` or else the package's in ``/lib/systemd/system`` (Redis's,
Sentinel's, Prometheus's), read by :class:`.systemd_unit.ServiceUnit` and started as its
``User=`` (``setpriv``) with its environment files, its ``ExecStop`` or kill signal to stop
it; ``enable`` and ``disable`` remembered in the lab's state, so a host that comes back starts
what was enabled on it (:meth:`GuideUnits.come_back`), and a peer's unit enabled or disabled
adds the peer to the flow's peers (``peer_ids()``) or takes it away. A ``Type=notify`` unit's start returns once its
server answers (systemd waits for its ready notice), another's at once.

The lab gives ``host()``, ``state``, ``save()``, ``peer_ids()``, ``on_host()``, ``answers()``,
the starting, waiting and stopping of its processes, and ``peer_statuses()``.

Under failure: a ``systemctl`` line the lab cannot run (a verb other than daemon-reload,
enable, disable, start, stop and restart; a unit the host does not have; a unit whose start
line cannot be made) raises :class:`~.guide_blocks.GuideError` naming it; a unit that does
not answer, or a peer that does not stream, by its deadline (or that exits first) raises
:class:`~.lab.LabError` with its logs; a stop that outlasts ``TimeoutStopSec`` ends in SIGKILL.
"""

from __future__ import annotations

import pwd
import re
import time
from pathlib import Path

from .guide_blocks import ROOTED, GuideError
from .guide_hosts import PEER_DEADLINE_S, PEER_HOSTS, ROOT_PATH, SERVER_DEADLINE_S
from .lab import LabError
from .lab_hosts import Launch, base_env
from .lab_network import LabProcess
from .systemd_unit import ServiceUnit, UnitError, read_environment_file

# The units the guide starts with systemctl: the server each runs (its name in the lab) and port.
UNIT_SERVERS = {"redis-server": ("redis", 6379), "redis-sentinel": ("sentinel", 26379),
                "twinflow-zookeeper": ("zookeeper", 2181), "prometheus": ("prometheus", 9090),
                "twinflow-spark-master": ("spark-master", 7077), "twinflow-spark-worker": ("spark-worker", 8081)}
SYSTEM_UNITS = Path("/lib/systemd/system")  # the packages' own units: the same on every machine


class GuideUnits:
    """``systemctl`` and the units it starts and stops on the guide's hosts (see module)."""

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


def _peer_of_unit(name: str) -> str | None:
    m = re.fullmatch(r"twinflow-peer@([\w.-]+)", name)
    return m.group(1) if m else None
