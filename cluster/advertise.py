"""The address a peer advertises to the others, and the checks that refuse one that cannot work.

A peer binds its gRPC server to ``--listen`` and registers ``--advertise``
in ZooKeeper: the address the master dials to escalate, that ``twinflow
status`` shows and that clients fail over to. The two differ on any real
deployment (bind ``0.0.0.0:7070``, advertise ``peer-a.example:7070``), and
TLS checks the advertised name against the peer's certificate.

Under failure: a start whose advertised address cannot work is refused
(:class:`~twinflow.cluster.on_cluster.StartRefused`, before anything
starts) with what to change:

- a wildcard ``--listen`` without ``--advertise`` (nobody can dial
  ``0.0.0.0``), or an ``--advertise`` without a port;
- a loopback ``--advertise`` (``127.0.0.1``, ``localhost``) while Redis or
  ZooKeeper is on another machine: the other peers are then elsewhere too,
  and a loopback address reaches only their own machine;
- a TLS certificate that does not name the advertised host (or
  ``--tls-server-name`` when given): every other peer's TLS check would fail.

>>> advertised("0.0.0.0:7070", "peer-a.example:7070", 7070)
'peer-a.example:7070'
>>> advertised("127.0.0.1:0", None, 41234)
'127.0.0.1:41234'
>>> server_hosts("redis+sentinel://s1:26379,s2:26379/flows/0", "zk1:2181,zk2:2181/twinflow")
['s1', 's2', 'zk1', 'zk2']
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from ..grpc_security import TlsFiles, loopback_host
from .on_cluster import StartRefused

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def split_host(address: str) -> tuple[str, str]:
    """(host, port) of ``HOST:PORT`` or ``[IPv6]:PORT``; port "" when there is none."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, rest.lstrip(":")
    if address.count(":") > 1:  # a bare IPv6 address
        return address, ""
    host, _, port = address.partition(":")
    return host, port


def advertised(listen: str, advertise: str | None, bound_port: int) -> str:
    """The address the others dial: ``advertise``, else the bound host with the bound port."""
    if advertise:
        return advertise
    host, _ = split_host(listen)
    return f"[{host}]:{bound_port}" if ":" in host else f"{host}:{bound_port}"


def server_hosts(redis_url: str, zk_hosts: str) -> list[str]:
    """The host of every Redis (Sentinel) and ZooKeeper server named by the peer's settings."""
    out = []
    _, _, rest = redis_url.partition("://")
    netloc = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    for part in netloc.split(",") + zk_hosts.split("/", 1)[0].split(","):
        host, _ = split_host(part.strip())
        if host:
            out.append(host)
    return out


def check_advertise(listen: str, advertise: str | None, *, redis_url: str, zk_hosts: str,
                    tls: TlsFiles | None) -> None:
    """Refuse (StartRefused, with what to change) an advertised address that cannot work."""
    listen_host, _ = split_host(listen)
    if not advertise:
        if listen_host in WILDCARD_HOSTS:
            raise StartRefused(
                f"--listen {listen} binds every interface, so the other peers need a name or address to "
                f"dial: pass --advertise HOST:PORT (this machine's name or address, and the listening port)")
        return
    host, port = split_host(advertise)
    if not host or not port.isdigit() or int(port) == 0:
        raise StartRefused(f"--advertise {advertise} needs a host and a port other peers can dial (HOST:PORT)")
    elsewhere = [h for h in server_hosts(redis_url, zk_hosts) if not loopback_host(h)]
    if loopback_host(host) and elsewhere:
        raise StartRefused(
            f"--advertise {advertise} is a loopback address, but Redis or ZooKeeper is on {elsewhere[0]}: "
            f"the other peers run on other machines and would dial their own. Advertise this machine's "
            f"name or address (and --listen on an interface they reach, or 0.0.0.0)")
    if tls is not None and tls.cert:
        name = tls.server_name or host
        names = certificate_names(tls.cert)
        if not any(name_matches(name, n) for n in names):
            raise StartRefused(
                f"the TLS certificate {tls.cert} names {', '.join(names) or 'no host'}, not {name}, the "
                f"name the other peers check when they dial {advertise}: make one for it (twinflow certs DIR "
                f"--peer NAME --name {name}) or advertise a name the certificate has")


def certificate_names(cert_path: str) -> list[str]:
    """The DNS names and IP addresses a PEM certificate is for (its subject alternative names,
    else its common name)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return san.get_values_for_type(x509.DNSName) + [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]


def name_matches(host: str, name: str) -> bool:
    """Whether certificate name ``name`` covers ``host`` (a ``*.`` wildcard covers one label).

    >>> name_matches("peer-a.example", "*.example"), name_matches("a.b.example", "*.example")
    (True, False)
    """
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(name)
    except ValueError:
        pass
    host, name = host.lower().rstrip("."), name.lower().rstrip(".")
    if name.startswith("*."):
        first, _, rest = host.partition(".")
        return bool(first) and rest == name[2:]
    return host == name
