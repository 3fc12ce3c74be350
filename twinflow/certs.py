"""``twinflow certs``: a development CA, peer certificates and tokens for a secured flow.

For trying TLS and tokens on a few machines, not for production (use your
organisation's CA there; docs/operations/security.md shows the OpenSSL steps):

- ``ca.pem`` / ``ca-key.pem``: a CA made on first use (valid ``ca_days``, 10 years by
  default) and reused after, so certificates made later for more peers are trusted by the
  earlier ones.
  Each CA has a name of its own and its certificates name its key, so that
  a bundle of two (``cat old/ca.pem new/ca.pem``, for a rotation) finds the
  right one for each certificate; a ``ca.pem`` that is such a bundle is
  reused by the certificate in it that matches ``ca-key.pem``;
- ``<peer>.pem`` / ``<peer>-key.pem``: a certificate signed by that CA for
  the names and addresses given (each a DNS name or an IP address), good for
  both serving (serverAuth) and escalating with mutual TLS (clientAuth), valid ``days`` (365
  by default) but never past the CA's own end: a certificate that would outlive its CA ends
  with it, and :attr:`CertsMade.warnings` says so (a certificate past its CA's end fails to
  verify from that day on, so the CA has to be replaced before then: a new CA, as the
  deployment guide's rotation does);
- ``ingest.token``, ``escalation.token``, ``admin.token``: 32 random bytes,
  URL-safe base64, made only when absent.

Keys and tokens are written with mode 0600. Under failure: a directory that
cannot be written raises ``OSError``; a ``ca.pem`` with no certificate for
``ca-key.pem``, or a CA that has expired (or ends within a day), raises
:class:`CertsError` before anything is written; nothing
is half written over an existing file (each file is written to a temporary
name and renamed).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> made = make_certs(d, "node-a", ["127.0.0.1", "node-a.example"])
>>> sorted(p.name for p in made)
['admin.token', 'ca-key.pem', 'ca.pem', 'escalation.token', 'ingest.token', 'node-a-key.pem', 'node-a.pem']
>>> sorted(p.name for p in make_certs(d, "node-b", ["127.0.0.1"]))  # the same CA and tokens
['node-b-key.pem', 'node-b.pem']
>>> other = pathlib.Path(tempfile.mkdtemp())  # a new CA, for a rotation
>>> _ = make_certs(other, "node-a", ["127.0.0.1"])
>>> _ = (d / "ca.pem").write_bytes((d / "ca.pem").read_bytes() + (other / "ca.pem").read_bytes())
>>> [p.name for p in make_certs(d, "node-c", ["127.0.0.1"])]  # the bundle's CA that has the key signs
['node-c-key.pem', 'node-c.pem']
>>> short = pathlib.Path(tempfile.mkdtemp())  # a CA with 30 days left signs for 30 days, and says so
>>> _ = make_certs(short, "node-a", ["127.0.0.1"], ca_days=30)
>>> made = make_certs(short, "node-b", ["127.0.0.1"])
>>> "node-b.pem ends with its CA" in made.warnings[0] and "not in 365 days: make a new CA" in made.warnings[0]
True
>>> days_left(short / "node-b.pem") == days_left(short / "ca.pem") <= 30
True
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TOKEN_SCOPES = ("ingest", "escalation", "admin")
VALID_DAYS = 365          # a peer's certificate
CA_VALID_DAYS = 3650      # a new CA: ten years, so that its certificates are renewed many times under it


class CertsError(ValueError):
    """The directory's CA files cannot be used together; the message names them."""


class CertsMade(list):
    """The files :func:`make_certs` made (a list of paths), with what it has to warn about."""

    def __init__(self):
        super().__init__()
        self.warnings: list[str] = []


def make_certs(directory: Path | str, node: str, names: list[str], days: int = VALID_DAYS,
               ca_days: int = CA_VALID_DAYS) -> CertsMade:
    """Make what is missing in ``directory`` for the peer ``node`` (see module doc); return the files made."""
    if days < 1 or ca_days < 1:
        raise CertsError(f"a certificate is made for a day or more (got days={days}, ca_days={ca_days})")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    made = CertsMade()
    ca_cert_path, ca_key_path = d / "ca.pem", d / "ca-key.pem"
    now = datetime.datetime.now(datetime.timezone.utc)
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = _ca_of(ca_key, ca_cert_path)
        if _not_after(ca_cert) - now < datetime.timedelta(days=1):
            raise CertsError(f"the CA in {ca_cert_path} ends on {_not_after(ca_cert):%Y-%m-%d %H:%M} UTC: a "
                             f"certificate it signs would not verify; make a new CA in another directory "
                             f"(docs/operations/deploy.md, \"A new CA and its certificates\")")
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        # A name of its own: a TLS library looks a certificate's issuer up by name first, and with two
        # CAs of one name in a bundle it may try only one of them.
        ca_name = _name(f"twinflow development CA {secrets.token_hex(4)}")
        ca_cert = _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, now + datetime.timedelta(days=ca_days),
                               ca=True)
        made += [_write(ca_key_path, _key_pem(ca_key), private=True), _write(ca_cert_path, _cert_pem(ca_cert))]
    key = ec.generate_private_key(ec.SECP256R1())
    ends = now + datetime.timedelta(days=days)
    if ends > _not_after(ca_cert):  # never past the CA: it would stop verifying on the CA's last day
        ends = _not_after(ca_cert)
        made.warnings.append(f"{node}.pem ends with its CA on {ends:%Y-%m-%d}, in {(ends - now).days} days, not in "
                             f"{days} days: make a new CA before then (docs/operations/deploy.md, \"A new CA and "
                             f"its certificates\")")
    cert = _certificate(_name(node), key.public_key(), ca_cert.subject, ca_key, ends, names=names or [node])
    made += [_write(d / f"{node}-key.pem", _key_pem(key), private=True), _write(d / f"{node}.pem", _cert_pem(cert))]
    for scope in TOKEN_SCOPES:
        path = d / f"{scope}.token"
        if not path.exists():
            made.append(_write(path, (secrets.token_urlsafe(32) + "\n").encode(), private=True))
    return made


def days_left(path: Path | str) -> int:
    """Whole days until the first certificate in ``path`` ends (negative once it has)."""
    cert = x509.load_pem_x509_certificates(Path(path).read_bytes())[0]
    return (_not_after(cert) - datetime.datetime.now(datetime.timezone.utc)).days


def _not_after(cert: x509.Certificate) -> datetime.datetime:
    try:
        return cert.not_valid_after_utc
    except AttributeError:  # cryptography before 42
        return cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)


def _ca_of(ca_key, ca_cert_path: Path) -> x509.Certificate:
    """The certificate in ``ca_cert_path`` (one, or a bundle of several) for ``ca_key``."""
    public = ca_key.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    for cert in x509.load_pem_x509_certificates(ca_cert_path.read_bytes()):
        if cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo) == public:
            return cert
    raise CertsError(f"{ca_cert_path} holds no certificate for the key in {ca_cert_path.with_name('ca-key.pem')}: "
                     f"make a new CA in another directory")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject, public_key, issuer, signing_key, not_after: datetime.datetime, ca: bool = False,
                 names: list[str] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))  # a peer's clock a little behind
               .not_valid_after(not_after)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
               # Names the signing key, so that the issuer is found by key as well as by name.
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()),
                              critical=False))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = (builder
                   .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names or []]),
                                  critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    return builder.sign(signing_key, hashes.SHA256())


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
