"""Which ``Host`` a request to the console may name: :class:`AllowedHosts`.

A page of another site can reach a console on loopback by DNS rebinding: its name comes to
resolve to 127.0.0.1, the browser then counts the console as the page's own origin, and
neither CORS nor the console's action header stops it. What the browser cannot change is
the ``Host`` it sends: the other site's name. So every request names one of:

- the address the connection came in on (``127.0.0.1``, ``[::1]``, ``10.0.0.5``): the bound
  address, or on a wildcard bind (``0.0.0.0``) the one the client dialled;
- ``localhost``, when that address is a loopback one;
- the name it was bound by (``--listen console.example:8470``), the names of its TLS
  certificate, and the names the operator gave (``--allow-host``).

The port is not compared: a forwarded port (``twinflow lab console``) keeps the name. A
request with no ``Host`` or another one is refused (421) before the application or the
metrics see it. Nothing here raises on what a client sends.

>>> hosts = AllowedHosts("127.0.0.1", names=["console.example"])
>>> [hosts.allows(h, "127.0.0.1") for h in ("127.0.0.1:8470", "localhost:8470", "Console.Example.", "attacker.example:8470", None)]
[True, True, True, False, False]
>>> AllowedHosts("0.0.0.0").allows("10.0.0.5:8470", "10.0.0.5"), AllowedHosts("0.0.0.0").allows("localhost", "10.0.0.5")
(True, False)
>>> AllowedHosts("::1").allows("[::1]:8470", "::1")
True
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Iterable


def host_name(header: str) -> str | None:
    """The host part of a ``Host`` header, lower case, without its port or a final dot; None when
    it is not one (empty, a bracket left open).

    >>> host_name("[::1]:8470"), host_name("Example.COM.:443"), host_name("10.0.0.5"), host_name("[::1")
    ('::1', 'example.com', '10.0.0.5', None)
    """
    header = header.strip()
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        name = header[1:end]
    else:
        name = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    name = name.lower().rstrip(".")
    return name or None


def _ip(text: str):
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


class AllowedHosts:
    """The ``Host`` names a console bound to ``bound`` (its listen host) answers to; see the module doc."""

    def __init__(self, bound: str, names: Iterable[str] = ()):
        bound = bound.strip("[]")
        self.bound_ip = _ip(bound)
        given = [bound] if self.bound_ip is None and bound else []
        self.names = frozenset(n for n in (host_name(name) for name in (*given, *names)) if n)

    def allows(self, header: str | None, local_ip: str | None) -> bool:
        """Whether a request with ``Host: header`` that came in on ``local_ip`` is for this console."""
        name = host_name(header) if header else None
        if name is None:
            return False
        if name in self.names:
            return True
        local = _ip(local_ip or "")
        if name == "localhost":
            return bool(local is not None and local.is_loopback)
        asked = _ip(name)
        if asked is None:
            return False
        if self.bound_ip is not None and not self.bound_ip.is_unspecified and asked == self.bound_ip:
            return True
        return local is not None and asked == _mapped(local)

    def describe(self) -> str:
        """The names accepted, for a refusal."""
        shown = ["the address the console was dialled at", "localhost (on loopback)", *sorted(self.names)]
        return ", ".join(shown)


def _mapped(ip):
    """An IPv4 address that came in on an IPv6 socket (``::ffff:10.0.0.5``) as itself."""
    return getattr(ip, "ipv4_mapped", None) or ip


def certificate_names(cert: str | None) -> list[str]:
    """The DNS names and addresses a PEM certificate names (its subject alternative names, else its
    common name); none for no certificate or one that cannot be read (TLS setup reports that)."""
    if not cert:
        return []
    from cryptography import x509  # a dependency already (twinflow certs); imported only with TLS

    try:
        parsed = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except (OSError, ValueError):
        return []
    try:
        san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        return [str(a.value) for a in parsed.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)]
