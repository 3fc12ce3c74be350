"""A systemd service unit's start and stop commands, as systemd would run them, for the lab.

The deployment guide ships one unit, ``deploy/systemd/twinflow-peer@.service``,
and one environment file per peer. The lab has no init system, so it reads
that unit and runs its ``ExecStart`` and ``ExecStop`` itself, expanded as
systemd expands them: the instance specifier ``%i`` (and ``%%``), the
``EnvironmentFile=`` and ``Environment=`` variables, ``${NAME}`` substituted
inside a word, a word that is exactly ``$NAME`` split on white space, and
``$MAINPID`` in ``ExecStop``. What the guide says is then what the lab runs.

Under failure: a unit or environment file that cannot be read, a directive
this reader does not support (a ``-``/``@``/``+`` prefix, several
``ExecStart`` lines) or a variable that is not set raises :class:`UnitError`
naming it; nothing is run with a half-expanded command.

>>> unit = ServiceUnit.parse('''
... [Service]
... Environment=PORT=7070
... ExecStart=/usr/bin/env twinflow run ${FLOW} --peer-id %i --listen 0.0.0.0:${PORT} $EXTRA
... ExecStop=/bin/kill -TERM $MAINPID
... ''')
>>> unit.start_argv("peer-a", {"FLOW": "/etc/f.yaml", "EXTRA": "-v  --x"})
['/usr/bin/env', 'twinflow', 'run', '/etc/f.yaml', '--peer-id', 'peer-a', '--listen', '0.0.0.0:7070', '-v', '--x']
>>> unit.stop_argv("peer-a", {}, main_pid=4242)
['/bin/kill', '-TERM', '4242']
>>> ServiceUnit.parse(chr(10).join(["[Service]", "User=twinflow", "ExecStart=/bin/true"])).user
'twinflow'
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WORD = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


class UnitError(ValueError):
    """A unit or environment file the lab cannot run as systemd would; the message says what."""


@dataclass
class ServiceUnit:
    """The ``[Service]`` section of a unit file, as far as the lab runs it."""

    exec_start: str
    exec_stop: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    environment_files: list[str] = field(default_factory=list)
    kill_signal: str = "SIGTERM"
    timeout_stop_s: float = 90.0
    user: str | None = None       # User=, Group=: whom the service runs as (None: root)
    group: str | None = None
    type: str = "simple"          # Type=: notify is ready once it says so (the lab: once it answers)

    @classmethod
    def read(cls, path: str | Path) -> "ServiceUnit":
        try:
            return cls.parse(Path(path).read_text())
        except OSError as exc:
            raise UnitError(f"cannot read the unit {path}: {exc}") from exc

    @classmethod
    def parse(cls, text: str) -> "ServiceUnit":
        section, found = "", {}
        environment: dict[str, str] = {}
        files: list[str] = []
        for line in _logical_lines(text):
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, sep, value = line.partition("=")
            if section != "Service" or not sep:
                continue
            key, value = key.strip(), value.strip()
            if key == "Environment":
                environment.update(_assignments(shlex.split(value)))
            elif key == "EnvironmentFile":
                files.append(value)
            elif key in ("ExecStart", "ExecStop"):
                if key in found:
                    raise UnitError(f"several {key}= lines: the lab runs one command each")
                if value[:1] in "-@+!:":
                    raise UnitError(f"{key}={value}: command prefixes are not supported by the lab")
                found[key] = value
            elif key in ("KillSignal", "TimeoutStopSec", "User", "Group", "Type"):
                found[key] = value
        if "ExecStart" not in found:
            raise UnitError("the unit has no ExecStart= in its [Service] section")
        # TimeoutStopSec=0 is systemd's "no time-out": the lab waits its default then.
        stop_s = float(found.get("TimeoutStopSec", "90").rstrip("s")) or 90.0
        return cls(found["ExecStart"], found.get("ExecStop"), environment, files,
                   found.get("KillSignal", "SIGTERM"), stop_s, found.get("User"), found.get("Group"),
                   found.get("Type", "simple"))

    def env_file_paths(self, instance: str) -> list[str]:
        """The environment files, ``%i`` expanded; one that may be missing keeps its ``-`` prefix."""
        return [_specifiers(p, instance) for p in self.environment_files]

    def start_argv(self, instance: str, env: dict[str, str]) -> list[str]:
        """``ExecStart`` for ``instance`` with ``env`` (the environment files' variables) expanded."""
        return _expand(self.exec_start, instance, {**self.environment, **env})

    def stop_argv(self, instance: str, env: dict[str, str], main_pid: int) -> list[str] | None:
        if self.exec_stop is None:
            return None
        return _expand(self.exec_stop, instance, {**self.environment, **env, "MAINPID": str(main_pid)})


def read_environment_file(path: str | Path) -> dict[str, str]:
    """``NAME=value`` lines (``#`` comments, optional quotes), as systemd's ``EnvironmentFile=`` reads them."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UnitError(f"cannot read the environment file {path}: {exc}") from exc
    return _assignments(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def _logical_lines(text: str):
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""


def _assignments(items) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise UnitError(f"not a NAME=value assignment: {item!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def _specifiers(text: str, instance: str) -> str:
    return text.replace("%%", "\0").replace("%i", instance).replace("%I", instance).replace("\0", "%")


def _expand(command: str, instance: str, env: dict[str, str]) -> list[str]:
    def value(name: str) -> str:
        if name not in env:
            raise UnitError(f"${name} is not set (the unit's Environment= or EnvironmentFile=)")
        return env[name]

    argv: list[str] = []
    for word in shlex.split(_specifiers(command, instance)):
        whole = _WORD.fullmatch(word)
        if whole:  # a word that is just $NAME: its value split into words, as systemd does
            argv.extend(value(whole.group(1)).split())
        else:
            argv.append(_BRACED.sub(lambda m: value(m.group(1)), word))
    return argv
