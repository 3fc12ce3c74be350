"""The certificate-expiry metric (twinflow/tls_expiry.py, cluster/metrics.py): the peer's own
certificate and the CA that signed it, found by signature among a rotation's CA bundle, read once
at the start; a file that cannot be read gives no reading and no refusal; a peer's metrics
endpoint serves the seconds left as of each scrape."""

from __future__ import annotations

import datetime
import logging
import urllib.request
from pathlib import Path
from types import SimpleNamespace

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client.parser import text_string_to_metric_families

from twinflow.cluster.metrics import PeerCollector
from twinflow.cluster.peer import start_metrics
from twinflow.cluster.peer_config import PeerConfig
from twinflow.grpc_security import GrpcSecurity, TlsFiles
from twinflow.tls_expiry import Expiry, read_expiries

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
DAY = 86400.0


class Authority:
    """A CA of its own name and end, that signs leaves (``cryptography``, as ``twinflow certs`` does)."""

    def __init__(self, name: str, days: float):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (self._builder(self.name, self.key.public_key(), days)
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def _builder(self, subject: x509.Name, public_key, days: float) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(self.name).public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(NOW - datetime.timedelta(days=1))
                .not_valid_after(NOW + datetime.timedelta(days=days)))

    def leaf(self, name: str, days: float) -> x509.Certificate:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        return self._builder(subject, key.public_key(), days).sign(self.key, hashes.SHA256())


def pem(path: Path, *certs: x509.Certificate) -> str:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return str(path)


def left_days(expiries: list[Expiry]) -> dict[tuple[str, str], float]:
    return {(e.certificate, e.subject): round(e.seconds_left(NOW.timestamp()) / DAY, 3) for e in expiries}


def test_the_peer_certificate_and_the_ca_that_signed_it_from_a_rotation_bundle(tmp_path):
    """Mid-rotation the CA file holds the old CA and the new one, both of the same name: the CA
    reading is the one whose key signed the peer's certificate, not the first nor the last to end."""
    old, new = Authority("twinflow CA", 20), Authority("twinflow CA", 700)
    tls = TlsFiles(cert=pem(tmp_path / "peer.pem", new.leaf("host-a.example", 300)), key="unused",
                   ca=pem(tmp_path / "ca.pem", old.cert, new.cert))
    got = read_expiries(tls)
    assert [e.certificate for e in got] == ["peer", "ca"]
    assert left_days(got) == {("peer", "CN=host-a.example"): 300.0, ("ca", "CN=twinflow CA"): 700.0}
    # Signed by the old one instead: its 20 days are what the alert must see.
    tls = TlsFiles(cert=pem(tmp_path / "peer.pem", old.leaf("host-a.example", 15)), key="unused", ca=tls.ca)
    assert left_days(read_expiries(tls)) == {("peer", "CN=host-a.example"): 15.0, ("ca", "CN=twinflow CA"): 20.0}


def test_the_ca_from_the_certificate_file_chain_and_without_a_certificate_of_its_own(tmp_path):
    ca, other = Authority("chain CA", 90), Authority("trusted CA", 400)
    # The signing CA only in the chain after the peer's certificate; the CA file trusts another.
    tls = TlsFiles(cert=pem(tmp_path / "chain.pem", ca.leaf("host-b.example", 60), ca.cert), key="unused",
                   ca=pem(tmp_path / "ca.pem", other.cert))
    assert left_days(read_expiries(tls)) == {("peer", "CN=host-b.example"): 60.0, ("ca", "CN=chain CA"): 90.0}
    # A client side only (a CA file, no certificate): the CA file's last to end.
    tls = TlsFiles(ca=pem(tmp_path / "two.pem", ca.cert, other.cert))
    assert left_days(read_expiries(tls)) == {("ca", "CN=trusted CA"): 400.0}
    assert read_expiries(None) == [] and read_expiries(TlsFiles()) == []


def test_a_file_that_cannot_be_read_gives_no_reading_and_no_refusal(tmp_path, caplog):
    ca = Authority("twinflow CA", 30)
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    with caplog.at_level(logging.WARNING, logger="twinflow.security"):
        got = read_expiries(TlsFiles(cert=str(bad), key="unused", ca=pem(tmp_path / "ca.pem", ca.cert)),
                            flow="f", peer="a")
        assert left_days(got) == {("ca", "CN=twinflow CA"): 30.0}
        assert read_expiries(TlsFiles(cert=str(tmp_path / "gone.pem"), key="unused")) == []
    events = [r for r in caplog.records if getattr(r, "event", None) == "tls_unreadable"]
    assert [r.file for r in events] == [str(bad), str(tmp_path / "gone.pem")]
    assert events[0].flow == "f" and events[0].peer == "a"


def samples(collector) -> dict[tuple[str, str], float]:
    return {(s.labels["certificate"], s.labels["subject"]): s.value for family in collector.collect()
            for s in family.samples if s.name == "twinflow_tls_expires_in_seconds"}


def test_the_collector_serves_the_seconds_left_at_each_scrape():
    # A member with nothing to read: its own metrics are left out (and logged), the peer's stay.
    member = SimpleNamespace(name="f", cfg=SimpleNamespace(peer_id="a"))
    now = [NOW.timestamp()]
    certs = [Expiry("peer", "CN=host-a.example", NOW.timestamp() + 10 * DAY),
             Expiry("ca", "CN=twinflow CA", NOW.timestamp() + 400 * DAY)]
    collector = PeerCollector(lambda: [member], certificates=certs, now=lambda: now[0])
    assert samples(collector) == {("peer", "CN=host-a.example"): 10 * DAY, ("ca", "CN=twinflow CA"): 400 * DAY}
    now[0] += 11 * DAY  # expired a day ago: negative
    assert samples(collector)[("peer", "CN=host-a.example")] == -DAY
    assert samples(PeerCollector(lambda: [member])) == {}  # no TLS: no series


def test_a_peer_with_tls_serves_the_metric_on_its_endpoint(tmp_path):
    """start_metrics, as a peer's start calls it: the certificates its config names, over HTTP."""
    ca = Authority("twinflow CA", 4000)
    leaf = ca.leaf("host-a.example", 3000)
    security = GrpcSecurity(tls=TlsFiles(cert=pem(tmp_path / "peer.pem", leaf), key="unused",
                                         ca=pem(tmp_path / "ca.pem", ca.cert)))
    cfg = PeerConfig(peer_id="a", redis_url="redis://unused", zk_hosts="unused", state_dir=str(tmp_path),
                     metrics_listen="127.0.0.1:0", security=security)
    member = SimpleNamespace(name="f", cfg=SimpleNamespace(peer_id="a"))
    metrics = start_metrics(cfg, lambda: [member], lambda: None, "f")
    try:
        with urllib.request.urlopen(f"http://{metrics.address}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        metrics.stop()
    got = {s.labels["certificate"]: (s.labels, s.value) for f in text_string_to_metric_families(text)
           for s in f.samples if s.name == "twinflow_tls_expires_in_seconds"}
    assert set(got) == {"peer", "ca"}
    labels, seconds = got["peer"]
    assert labels == {"flow": "f", "peer": "a", "node": "a", "certificate": "peer", "subject": "CN=host-a.example"}
    # The seconds to the certificate's end from this scrape (a few seconds of test time at most).
    expected = leaf.not_valid_after_utc.timestamp() - datetime.datetime.now(datetime.timezone.utc).timestamp()
    assert abs(seconds - expected) < 60
