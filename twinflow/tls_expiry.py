"""How long the TLS certificates a peer serves with stay valid: its own and the CA's that signed it.

:func:`read_expiries` reads a peer's :class:`~twinflow.grpc_security.TlsFiles` once, at its start,
as its gRPC server loads them then: the first certificate of ``tls.cert`` (the peer's own) and the
CA certificate that signed it, found among ``tls.ca`` and the rest of ``tls.cert`` (a chain) by its
signature, not by its name (a renewed CA may keep the old one's name, and a CA file mid-rotation
holds both). The metrics (``twinflow_tls_expires_in_seconds``, cluster/metrics.py) subtract the
time of each scrape from what it read. A renewed file counts from the peer's next start, which is
also when its server takes the new certificate: until then the old one is what others check.

Under failure:

- A file that cannot be read or holds no certificate this module can parse gives no reading of
  its own, and a warning (event ``tls_unreadable``); it never refuses the start (the server's own
  loading refuses a file it cannot use, with its reason).
- When none of the CA certificates signed the peer's own (a public CA not in the files), or the
  peer has no certificate of its own and checks the others' with ``tls.ca`` only, the CA reading
  is the CA file's certificate that expires last: what checks the other peers stops at that
  time at the latest. Without a CA file there is no CA reading.
- Nothing here raises: a peer serves its metrics with or without these readings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from .grpc_security import TlsFiles
from .logs import event

log = logging.getLogger("twinflow.security")


@dataclass(frozen=True)
class Expiry:
    """One certificate's end: ``certificate`` says whose (``peer`` or ``ca``)."""

    certificate: str
    subject: str      # RFC 4514, e.g. "CN=host-a.example"
    not_after: float  # seconds since the epoch (UTC)

    def seconds_left(self, now: float) -> float:
        """Seconds from ``now`` until the certificate expires (negative once it has)."""
        return self.not_after - now


def read_expiries(tls: TlsFiles | None, *, flow: str | None = None, peer: str | None = None) -> list[Expiry]:
    """The peer's own certificate's and its CA's ends (see the module doc); [] without TLS."""
    if tls is None:
        return []
    chain = _certificates(tls.cert, "tls.cert", flow, peer) if tls.cert else []
    cas = _certificates(tls.ca, "tls.ca", flow, peer) if tls.ca else []
    out = []
    own = chain[0] if chain else None
    if own is not None:
        out.append(_expiry("peer", own))
    issuer = next((ca for ca in cas + chain[1:] if own is not None and _signed(own, ca)), None)
    if issuer is None and cas:
        issuer = max(cas, key=lambda c: c.not_valid_after_utc)
    if issuer is not None:
        out.append(_expiry("ca", issuer))
    return out


def _expiry(certificate: str, cert: x509.Certificate) -> Expiry:
    return Expiry(certificate, cert.subject.rfc4514_string(), cert.not_valid_after_utc.timestamp())


def _signed(cert: x509.Certificate, by: x509.Certificate) -> bool:
    """Whether ``by``'s key signed ``cert`` (and ``by`` is named its issuer)."""
    try:
        cert.verify_directly_issued_by(by)
        return True
    except Exception:  # another CA, another key type, or not a CA at all: not this one
        return False


def _certificates(path: str, what: str, flow: str | None, peer: str | None) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        event(log, logging.WARNING, "tls_unreadable", "%s (%s): no certificate read for its expiry metric: %s",
              what, path, exc, flow=flow, peer=peer, file=path)
        return []
    return found
