"""Faults a lab host can suffer beside dying (:meth:`.lab.Lab.kill_host`): packets dropped by
its own firewall, a wall clock that is off, and which Spark worker hosts an application's
executors are on.

- :class:`HostFirewall` drops packets between one host and some addresses with nftables, in
  that host's network namespace only (a table of its own, ``inet twinflow_lab``): ``both``
  directions (a partition: connections stay open and go silent, only time-outs tell) or
  ``out`` only (an asymmetric partition: what the host sends is lost, what it receives
  arrives). The rules never reach this machine's own firewall: the namespace is one the lab
  made, and the table goes with it.
- :func:`fake_clock_env` is the environment that runs a process and its children (a peer's
  JVM too) under libfaketime with its wall clock ``offset_s`` off; the monotonic clock stays
  true, as NTP would leave it. The library is the one the PyPI package ``libfaketime`` ships
  (the ``chaos`` extra): Debian 12's 0.9.10 with a true monotonic clock makes Python 3.11's
  ``time.sleep`` fail with EINVAL (its absolute ``clock_nanosleep`` on the monotonic clock).
- :func:`true_clock_java` is a ``JAVA_HOME`` whose ``java`` runs without libfaketime: under
  it a peer's JVM took two minutes to start instead of 25 s (every one of its many clock
  reads goes through the library). The JVM's wall clock does not enter the flow's time, which
  the peer's Python keeps (``cluster/flow_clock.py``), so a skewed peer keeps it true.
- :func:`executor_hosts` finds the Spark worker hosts running an application's executors.

Under failure: a missing ``nft`` or libfaketime raises :class:`LabFaultUnavailable` with what
to install; nft refusing a rule raises it with nft's message.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from .lab_network import netns_exec, pids_in

if TYPE_CHECKING:
    from .lab import Lab

TABLE = "twinflow_lab"


class LabFaultUnavailable(RuntimeError):
    """A tool the fault needs is missing or refused; the message says which."""


class HostFirewall:
    """Packet drops on lab host ``host`` (see module); :meth:`heal` removes every one."""

    def __init__(self, lab: "Lab", host: str):
        if shutil.which("nft") is None:
            raise LabFaultUnavailable("nft is not installed (apt-get install nftables)")
        self.ns = lab.state.host(host).ns
        self.host = host
        self.rules = 0

    def _nft(self, script: str) -> None:
        proc = subprocess.run(netns_exec(self.ns, ["nft", "-f", "-"]), input=script, capture_output=True,
                              text=True, timeout=10, executable=shutil.which("ip"))
        if proc.returncode != 0:
            raise LabFaultUnavailable(f"nft refused the rules on {self.host}: {proc.stderr.strip()}")

    def drop(self, addresses: list[str], direction: str = "both") -> None:
        """From now on drop every packet the host sends to ``addresses`` and, with ``both``,
        every packet it receives from them (connections already open too)."""
        if direction not in ("both", "out"):
            raise ValueError(f"direction is both or out, not {direction!r}")
        script = ""
        if not self.rules:
            script += (f"add table inet {TABLE}\n"
                       f"add chain inet {TABLE} out {{ type filter hook output priority 0; }}\n"
                       f"add chain inet {TABLE} in {{ type filter hook input priority 0; }}\n")
        targets = "{ " + ", ".join(addresses) + " }"
        script += f"add rule inet {TABLE} out ip daddr {targets} drop\n"
        if direction == "both":
            script += f"add rule inet {TABLE} in ip saddr {targets} drop\n"
        self._nft(script)
        self.rules += 1

    def heal(self) -> None:
        """Drop nothing any more (the table goes whole)."""
        if self.rules:
            self._nft(f"delete table inet {TABLE}\n")
            self.rules = 0


def fake_clock_env(offset_s: float) -> dict[str, str]:
    """The environment for a process whose wall clock is ``offset_s`` seconds off (see module);
    its children inherit it."""
    try:
        import libfaketime
    except ImportError:
        raise LabFaultUnavailable("the libfaketime package is not installed (pip install 'twinflow[chaos]')") from None
    lib = Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    if not lib.is_file():
        raise LabFaultUnavailable(f"the libfaketime package has no library at {lib}")
    return {"LD_PRELOAD": str(lib), "FAKETIME": f"{offset_s:+g}", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def true_clock_java(directory: Path) -> dict[str, str]:
    """The environment (``JAVA_HOME``) whose ``bin/java`` is this machine's java run without
    libfaketime (see module); written under ``directory``."""
    java = shutil.which("java")
    if java is None:
        raise LabFaultUnavailable("java is not installed (apt-get install openjdk-17-jre-headless)")
    script = Path(directory) / "bin" / "java"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f'#!/bin/sh\nunset LD_PRELOAD FAKETIME FAKETIME_DONT_FAKE_MONOTONIC\n'
                      f'exec {shlex.quote(str(Path(java).resolve()))} "$@"\n')
    script.chmod(0o755)
    return {"JAVA_HOME": str(Path(directory).resolve())}


def executor_hosts(lab: "Lab", app_name: str) -> list[str]:
    """The Spark worker hosts on which application ``app_name`` (``twinflow-<flow>-<peer>``,
    as a peer names its Spark session) has an executor running."""
    apps = [a["id"] for a in (lab.spark_state() or {}).get("activeapps", []) if a.get("name") == app_name]
    hosts = []
    for host in ("sw1", "sw2"):
        for pid in pids_in(lab.state.host(host).ns):
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"--app-id" in argv and argv[argv.index(b"--app-id") + 1].decode() in apps:
                hosts.append(host)
                break
    return hosts

