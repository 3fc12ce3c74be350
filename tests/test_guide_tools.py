"""What the deployment guide ships besides its pages: ``twinflow certs`` gives the CA a life of
its own and never signs a certificate that outlives it; ``twinflow console`` dials the peers with
``TWINFLOW_TLS_CA`` as every operator command does; ``twinflow status`` keeps the peers it found
in the operator's cache directory, and goes on with one warning line when it cannot."""

from __future__ import annotations

import datetime
import json

import pytest
from cryptography import x509

from twinflow.certs import CertsError, days_left, make_certs
from twinflow.cli import build_parser, main
from twinflow.cli_console import console_dialling
from twinflow.cli_peer import cmd_status, peers_seen_path

FLOW = """\
flow: ops
uplink: {stream: uplink}
message: {id: id}
input: deliver
nodes:
  deliver: {type: action, sink: {stream: sink}}
  sort: {type: sort, pairs_with: deliver, key: seq, bake_time: 2}
"""


def _ends(path) -> datetime.datetime:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)


def test_a_new_ca_lives_ten_years_and_its_certificates_a_year(tmp_path):
    main(["certs", str(tmp_path), "--peer", "peer-a", "--name", "host-a.example"])
    assert 3640 <= days_left(tmp_path / "ca.pem") <= 3650
    assert 360 <= days_left(tmp_path / "peer-a.pem") <= 365
    main(["certs", str(tmp_path / "short"), "--peer", "peer-a", "--days", "30", "--ca-days", "400"])
    assert 395 <= days_left(tmp_path / "short" / "ca.pem") <= 400 and days_left(tmp_path / "short" / "peer-a.pem") <= 30


def test_a_certificate_that_would_outlive_its_ca_ends_with_it_and_the_command_says_so(tmp_path, capsys):
    main(["certs", str(tmp_path), "--peer", "peer-a", "--ca-days", "30"])
    capsys.readouterr()
    assert main(["certs", str(tmp_path), "--peer", "peer-b", "--name", "host-b.example"]) == 0
    err = capsys.readouterr().err
    assert "twinflow certs: warning: peer-b.pem ends with its CA on" in err
    assert "not in 365 days: make a new CA before then" in err
    assert _ends(tmp_path / "peer-b.pem") <= _ends(tmp_path / "ca.pem")
    assert days_left(tmp_path / "peer-b.pem") <= 30


def test_a_ca_at_its_end_signs_nothing(tmp_path):
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "ending CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=300))
            .not_valid_after(now + datetime.timedelta(hours=3))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "ca-key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                            serialization.PrivateFormat.PKCS8,
                                                            serialization.NoEncryption()))
    with pytest.raises(CertsError, match="make a new CA in another directory"):
        make_certs(tmp_path, "peer-a", ["host-a.example"])
    assert not (tmp_path / "peer-a.pem").exists()


def test_the_console_dials_the_peers_with_the_ca_of_twinflow_tls_ca(tmp_path, monkeypatch):
    (tmp_path / "flow.yaml").write_text(FLOW)
    monkeypatch.setenv("TWINFLOW_TLS_CA", "/etc/twinflow/tls/ca.pem")
    args = build_parser().parse_args(["console", str(tmp_path / "flow.yaml")])
    assert console_dialling(args).tls_ca == "/etc/twinflow/tls/ca.pem"
    args = build_parser().parse_args(["console", str(tmp_path / "flow.yaml"), "--tls-ca", "/other/ca.pem"])
    assert console_dialling(args).tls_ca == "/other/ca.pem"  # the flag over the variable


class _Shard:
    def read_statuses(self, deadline_s):
        return [{"peer_id": "peer-a", "role": "master", "grpc_address": "host-a.example:7070", "streaming": "1"}]

    def uplink_behind(self, peer_id):
        return 0, 0.0


@pytest.fixture
def status_args(tmp_path, monkeypatch):
    (tmp_path / "flow.yaml").write_text(FLOW)
    import twinflow.cli_peer as cli_peer

    monkeypatch.setattr(cli_peer, "_flow_stores", lambda args: (cli_peer._load_flow(args.flow), [_Shard()]))
    for name in ("TWINFLOW_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return build_parser().parse_args(["status", str(tmp_path / "flow.yaml")])


def test_status_keeps_the_peers_it_found_in_the_cache_directory_not_the_current_one(status_args, tmp_path,
                                                                                     monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert peers_seen_path("ops") == tmp_path / "home" / ".cache" / "twinflow" / "peers-ops.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cmd_status(status_args) == 0
    assert json.loads((tmp_path / "xdg" / "twinflow" / "peers-ops.json").read_text()) == ["host-a.example:7070"]
    monkeypatch.setenv("TWINFLOW_CACHE_DIR", str(tmp_path / "chosen"))
    assert cmd_status(status_args) == 0
    assert (tmp_path / "chosen" / "peers-ops.json").exists()
    assert not (tmp_path / ".twinflow").exists()
    assert "peer-a" in capsys.readouterr().out


def test_status_that_cannot_keep_the_peers_warns_in_one_line_and_answers(status_args, tmp_path, monkeypatch,
                                                                         capsys):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("TWINFLOW_CACHE_DIR", str(blocked / "twinflow"))
    assert cmd_status(status_args) == 0
    out, err = capsys.readouterr()
    assert "peer-a" in out
    warning = [line for line in err.splitlines() if line]
    assert len(warning) == 1 and warning[0].startswith("twinflow: warning: could not keep the peers found in")
    assert "Traceback" not in err
