"""A lab network on this machine: Linux network namespaces on one private bridge, nothing
leaving the machine.

:func:`create` builds, as root and with iproute2's ``ip``:

- a hub namespace ``<prefix>hub`` holding the bridge ``br0``, with no address, no uplink and
  no route: the bridge is in the hub, never in this machine's own namespace;
- one namespace ``<prefix><host>`` per host, with loopback up and ``eth0``, a veth whose other
  end (``v-<host>``, in the hub) is a port of the bridge; ``eth0`` has one address of the
  lab's /24 and there is no default route, so a packet for anything outside the lab fails
  at once (``Network is unreachable``) instead of leaving;
- ``/etc/netns/<ns>/hosts`` per host (``ip netns exec`` bind-mounts it over ``/etc/hosts``):
  ``localhost``, ``<host>.lab`` for every host of the lab, and this machine's hostname as the
  host's own address (Spark resolves it), after the host's own ``.lab`` name (:func:`hosts_file`).

Each namespace and ``/etc/netns`` directory is written to the state file (:class:`LabState`)
the moment it is made, and made exclusively (``ip netns add`` and ``mkdir`` fail on one that
exists), so the file never lists one that anything else made; so are the processes the lab
starts in the namespaces (:class:`LabProcess`). :func:`teardown` removes exactly what the
state lists and nothing else: processes first (by PID, SIGTERM then SIGKILL of their process
group; only a process still in a namespace the lab made counts as one the lab started, so a
PID reused since is never signalled), then the veths in the hub, the namespaces and the
``/etc/netns`` directories. Anything listed that does not exist (a half-made lab, a second
``down``) is passed over.

From this machine's own namespace nothing may dial a lab address: its default route would
carry the packet off the machine. :func:`entered` puts one thread into a host's namespace for
the time it takes to open a socket, so the orchestrator can probe the lab's servers from
inside it; a process runs on a host through :func:`netns_exec`.

Under failure: not root, or no usable ``ip netns``, raises :class:`LabUnavailable` saying what
is missing (:func:`check_usable`); an ``ip`` command that fails raises :class:`LabNetError`
with its command line and stderr, and what was made before it stays listed in the state, for
:func:`teardown`. :func:`teardown` never raises for something already gone; it refuses (and
reports) a listed name outside the lab's prefix.

>>> state = LabState(prefix="tflab-", subnet="10.213.47.0/24")
>>> host = state.add_host("redis", 10)
>>> host.ns, host.address, host.veth
('tflab-redis', '10.213.47.10', 'v-redis')
>>> peer = state.add_host("peer-a", 31)
>>> print(hosts_file(state, peer, "box"))
127.0.0.1 localhost
10.213.47.10 redis.lab
10.213.47.31 peer-a.lab box
<BLANKLINE>
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

DEFAULT_PREFIX = "tflab-"
DEFAULT_SUBNET = "10.213.47.0/24"
BRIDGE = "br0"
DOMAIN = "lab"
NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")
_CLONE_NEWNET = 0x40000000
_IP_TIMEOUT_S = 10.0
# Namespace names are file names under /run/netns; the lab keeps them short and plain.
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")


class LabUnavailable(RuntimeError):
    """This machine cannot hold a lab here (not root, no usable ``ip netns``); the message says why."""


class LabNetError(RuntimeError):
    """An ``ip`` command failed; the message holds the command and its stderr."""


@dataclass
class HostNet:
    """One lab host: its name, namespace, address, and the veth of it in the hub."""

    name: str
    ns: str
    address: str
    veth: str
    domain: str = DOMAIN

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{self.domain}"


@dataclass
class LabProcess:
    """A process the lab started on a host: a session leader (its PID is its process group's)."""

    host: str
    name: str
    pid: int
    log: str = ""
    port: int = 0


@dataclass
class LabState:
    """What a lab made, in the order it made it; saved as JSON (:meth:`save`, :meth:`load`).

    ``info`` holds what the lab above the network records (its form, flow, timings)."""

    prefix: str = DEFAULT_PREFIX
    subnet: str = DEFAULT_SUBNET
    hub: str = ""
    hosts: list[HostNet] = field(default_factory=list)      # the plan: every host, made or not
    namespaces: list[str] = field(default_factory=list)     # made by this lab, in order
    netns_dirs: list[str] = field(default_factory=list)     # made by this lab
    processes: list[LabProcess] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    domain: str = DOMAIN    # every host is <name>.<domain> in the hosts' /etc/hosts

    def __post_init__(self) -> None:
        if not _PREFIX_RE.match(self.prefix):
            raise ValueError(f"lab prefix {self.prefix!r}: lower-case letters, digits and '-', "
                             f"starting with a letter, at most 24 characters")
        net = ipaddress.ip_network(self.subnet)
        if net.prefixlen != 24 or not net.is_private:
            raise ValueError(f"lab subnet {self.subnet}: a private /24 (e.g. {DEFAULT_SUBNET})")
        self.hub = self.hub or f"{self.prefix}hub"

    def add_host(self, name: str, octet: int) -> HostNet:
        """Record host ``name`` at address ``octet`` of the subnet (not yet made)."""
        net = ipaddress.ip_network(self.subnet)
        if not 2 <= octet <= 254:
            raise ValueError(f"host {name}: address .{octet} is not a host address the lab gives (2-254)")
        host = HostNet(name, f"{self.prefix}{name}", str(net.network_address + octet), f"v-{name}", self.domain)
        self.hosts.append(host)
        return host

    def host(self, name: str) -> HostNet:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no lab host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def save(self, path: str | os.PathLike) -> None:
        """Write the state atomically (a temporary file renamed over the old)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LabState":
        raw = json.loads(Path(path).read_text())
        raw["hosts"] = [HostNet(**h) for h in raw.get("hosts", [])]
        raw["processes"] = [LabProcess(**p) for p in raw.get("processes", [])]
        return cls(**raw)


# -- preconditions ------------------------------------------------------------------------------
def check_usable(prefix: str = DEFAULT_PREFIX) -> None:
    """Raise :class:`LabUnavailable` unless this process is root and ``ip netns`` works here (a
    namespace ``<prefix>probe-<pid>`` is made and deleted to find out)."""
    if os.geteuid() != 0:
        raise LabUnavailable("a lab needs root (network namespaces, a bridge, /etc/netns): "
                             f"this process runs as uid {os.geteuid()}")
    if shutil.which("ip") is None:
        raise LabUnavailable("iproute2's `ip` is not installed (apt-get install iproute2)")
    probe = f"{prefix}probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except LabNetError as exc:
        raise LabUnavailable(f"`ip netns` is not usable here: {exc}") from None
    try:
        _ip("netns", "del", probe)
    except LabNetError as exc:
        raise LabUnavailable(f"`ip netns` is not usable here (could not delete {probe}): {exc}") from None


def _ip(*args: str) -> str:
    argv = ["ip", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_IP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LabNetError(f"`{' '.join(argv)}` did not finish within {_IP_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise LabNetError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


# -- building -----------------------------------------------------------------------------------
def create(state: LabState, state_path: str | os.PathLike, hostname: str | None = None) -> None:
    """Make the hub, its bridge and every host of ``state`` (see module); each namespace and
    directory is saved to ``state_path`` as soon as it is made."""
    hostname = hostname or socket.gethostname()
    state.save(state_path)

    def add_namespace(ns: str) -> None:
        _ip("netns", "add", ns)  # fails on a namespace that exists: never one another lab made
        state.namespaces.append(ns)
        state.save(state_path)

    add_namespace(state.hub)
    _ip("-n", state.hub, "link", "set", "lo", "up")
    _ip("-n", state.hub, "link", "add", BRIDGE, "type", "bridge")
    _ip("-n", state.hub, "link", "set", BRIDGE, "up")
    NETNS_ETC.mkdir(exist_ok=True)
    for host in state.hosts:
        add_namespace(host.ns)
        _ip("-n", state.hub, "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        _ip("-n", state.hub, "link", "set", host.veth, "master", BRIDGE, "up")
        _ip("-n", host.ns, "link", "set", "lo", "up")
        _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.ns, "link", "set", "eth0", "up")
        directory = NETNS_ETC / host.ns
        directory.mkdir()  # FileExistsError on one left by something else: not ours to list
        state.netns_dirs.append(str(directory))
        state.save(state_path)
        (directory / "hosts").write_text(hosts_file(state, host, hostname))


def hosts_file(state: LabState, host: HostNet, hostname: str) -> str:
    """The /etc/hosts a host sees: localhost, every lab host by ``<name>.<domain>`` (``.lab``), and this
    machine's hostname as the host's own address, after its ``.lab`` name: the first name of an
    address is its canonical name, which Spark's driver advertises to executors on other hosts,
    where the machine's hostname is their own address."""
    lines = ["127.0.0.1 localhost"]
    lines += [f"{h.address} {h.fqdn}" + (f" {hostname}" if h is host else "") for h in state.hosts]
    return "\n".join(lines) + "\n"


def netns_exec(ns: str, argv: list[str]) -> list[str]:
    """``argv`` run in namespace ``ns``; ``ip netns exec`` exec()s it, so the PID of the process
    started is the program's own."""
    return ["ip", "netns", "exec", ns, *argv]


# -- reaching into a namespace ------------------------------------------------------------------
_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def entered(ns: str) -> Iterator[None]:
    """This thread in network namespace ``ns`` for the block, and back after it. A socket opened
    in the block belongs to ``ns`` for good; other threads are not moved."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(NETNS_RUN / ns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def connect_in(ns: str, address: str, port: int, timeout_s: float = 1.0) -> socket.socket:
    """A TCP connection to ``address:port`` made from inside namespace ``ns``."""
    with entered(ns):
        return socket.create_connection((address, port), timeout=timeout_s)


def ns_inode(ns: str) -> int | None:
    """The inode of namespace ``ns`` (None when it does not exist)."""
    try:
        return os.stat(NETNS_RUN / ns).st_ino
    except OSError:
        return None


def pids_in(ns: str) -> list[int]:
    """Every process whose network namespace is ``ns`` (as ``ip netns pids`` lists them)."""
    inode = ns_inode(ns)
    if inode is None:
        return []
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _proc_ns_inode(int(entry.name)) == inode:
            out.append(int(entry.name))
    return sorted(out)


def _proc_ns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# -- teardown -----------------------------------------------------------------------------------
class HostOps:
    """What :func:`teardown` does to this machine, one primitive a method (a test passes a fake)."""

    def group_in(self, pgid: int, ns: str) -> list[int]:
        """The live processes of process group ``pgid`` that are in namespace ``ns``."""
        return [pid for pid in pids_in(ns) if _pgid(pid) == pgid]

    def signal(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        _reap(pid)

    def signal_group(self, pgid: int, sig: int) -> None:
        """``sig`` to every process of group ``pgid`` in one call (a child forked meanwhile too).
        Called only while :meth:`group_in` finds the group in a lab namespace, so its ID cannot
        have been given to another group."""
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        _reap(pgid)

    def wait(self, condition, deadline_s: float) -> bool:
        end = time.monotonic() + deadline_s
        while not condition():
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def namespaces(self) -> set[str]:
        try:
            return {p.name for p in NETNS_RUN.iterdir()}
        except OSError:
            return set()

    def links(self, ns: str) -> set[str]:
        try:
            out = _ip("-n", ns, "-o", "link", "show")
        except LabNetError:
            return set()
        return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}

    def ip(self, *args: str) -> None:
        _ip(*args)

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path)


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status when it is a child of this process (the lab made by this
    process), so it does not linger as a zombie; nothing for anyone else's."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def teardown(state: LabState, ops: HostOps | None = None, term_deadline_s: float = 15.0) -> list[str]:
    """Remove what ``state`` lists and still exists (see module); returns one line per thing
    removed or refused, in the order done."""
    ops = ops or HostOps()
    done: list[str] = []
    ns_of = {h.name: h.ns for h in state.hosts}
    made = set(state.namespaces)
    mine = lambda name: name.startswith(state.prefix)  # noqa: E731
    # Processes, the last started first: SIGTERM the leader (a peer hands over; its JVM follows),
    # then SIGKILL whatever of its group is still in the lab's namespace.
    for proc in reversed(state.processes):
        ns = ns_of.get(proc.host, "")
        if not (mine(ns) and ns in made):
            done.append(f"refused: process {proc.pid} ({proc.name}) is on {proc.host}, not in a namespace "
                        f"this lab made")
            continue
        group = ops.group_in(proc.pid, ns)
        if not group:
            continue
        gone = lambda: not ops.group_in(proc.pid, ns)  # noqa: E731
        if proc.pid in group:
            ops.signal(proc.pid, signal.SIGTERM)
            if ops.wait(gone, term_deadline_s):
                done.append(f"stopped {proc.name} (pid {proc.pid}) on {proc.host}")
                continue
        if not gone():
            ops.signal_group(proc.pid, signal.SIGKILL)
        ops.wait(gone, 10.0)
        done.append(f"killed {proc.name} (pid {proc.pid}, its process group) on {proc.host}")
    present = ops.namespaces()
    if state.hub in present and state.hub in made and mine(state.hub):
        links = ops.links(state.hub)
        for host in state.hosts:
            if host.veth in links:
                ops.ip("-n", state.hub, "link", "del", host.veth)
                done.append(f"deleted veth {host.veth} (in {state.hub})")
    for ns in reversed(state.namespaces):  # the hosts, then the hub
        if not mine(ns):
            done.append(f"refused: namespace {ns} is outside the lab's prefix {state.prefix}")
        elif ns in present:
            ops.ip("netns", "del", ns)
            done.append(f"deleted namespace {ns}")
    for path in state.netns_dirs:
        p = Path(path)
        if p.parent != NETNS_ETC or not mine(p.name):
            done.append(f"refused: {path} is not an /etc/netns directory of the lab")
        elif ops.exists(path):
            ops.rmtree(path)
            done.append(f"removed {path}")
    return done
