"""Kernel-level network faults for drills: nftables drops inside a network namespace of the drill's own.

The fault proxy cuts a link by closing its connections (the peer sees a
reset or an end of stream at once). A dropped packet is another fault: the
connection stays open and goes silent, and only time-outs tell. This module
drops every TCP packet to or from one loopback port, with nftables, and only
ever inside a network namespace that the drill created for itself:

- :func:`in_private_netns` is true only when the command that made this
  process's network namespace recorded the namespace it came from
  (``TWINFLOW_DRILL_NETNS``, set by :func:`netns_command`) and this process
  is in another one;
- :class:`PortDrops` refuses to start anywhere else, so no rule ever reaches
  the host's firewall;
- :func:`netns_command` wraps a command in ``unshare --net`` with the
  namespace's loopback brought up, so a drill can re-run itself there: every
  server and peer it starts binds to that namespace's 127.0.0.1.

Under failure: rules live in one table of their own (``inet twinflow_drill``);
:meth:`PortDrops.heal` deletes it whole, and the namespace (with its rules)
ends with the drill's process in any case.
"""

from __future__ import annotations

import os
import shutil
import subprocess

NETNS_ENV = "TWINFLOW_DRILL_NETNS"
TABLE = "twinflow_drill"


class KernelFaultsUnavailable(RuntimeError):
    """nftables or a private network namespace is missing; the message says which and how to get it."""


def _netns() -> str:
    return os.readlink("/proc/self/ns/net")  # "net:[<inode>]"


def in_private_netns() -> bool:
    """True when this process runs in a network namespace that a drill made for itself."""
    came_from = os.environ.get(NETNS_ENV)
    return bool(came_from) and came_from != _netns()


def netns_command(argv: list[str]) -> list[str]:
    """``argv`` to run in a new network namespace (loopback up), marked with the one it left."""
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            raise KernelFaultsUnavailable(f"{tool} is not installed (util-linux, iproute2)")
    if os.environ.get(NETNS_ENV):  # already asked for one: never nest (and never loop)
        raise KernelFaultsUnavailable(f"{NETNS_ENV} is set but this is not a network namespace of its own")
    return ["unshare", "--net", "--", "sh", "-c",
            f'ip link set lo up && export {NETNS_ENV}="{_netns()}" && exec "$@"', "sh", *argv]


def _nft(script: str) -> None:
    proc = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=10)
    if proc.returncode != 0:
        raise KernelFaultsUnavailable(f"nft refused the rules: {proc.stderr.strip()}")


class PortDrops:
    """Drop TCP packets to and from loopback ports, until healed (see module)."""

    def __init__(self) -> None:
        if shutil.which("nft") is None:
            raise KernelFaultsUnavailable("nft is not installed (apt-get install nftables)")
        if not in_private_netns():
            raise KernelFaultsUnavailable("kernel faults run only in the drill's own network namespace "
                                          "(twinflow drill starts one with unshare --net)")
        self.ports: set[int] = set()

    def drop(self, port: int) -> None:
        """From now on every packet to or from ``port`` is dropped, on connections already open too."""
        if not self.ports:
            _nft(f"add table inet {TABLE}\n"
                 f"add chain inet {TABLE} out {{ type filter hook output priority 0; }}\n")
        _nft(f"add rule inet {TABLE} out tcp dport {port} drop\n"
             f"add rule inet {TABLE} out tcp sport {port} drop\n")
        self.ports.add(port)

    def heal(self) -> None:
        """Drop nothing any more (the table goes whole)."""
        if self.ports:
            _nft(f"delete table inet {TABLE}\n")
            self.ports.clear()
