"""The gRPC options of the operator commands (``status``, ``handover``): each flag over its
``TWINFLOW_*`` variable over the flow file's ``security`` section; a client certificate and its
key taken whole from one place, half a pair refused with exit 2 naming the option; only the
tokens the command sends read (for a command that only reads, the read token when one is named,
else the admin token); and the two helpers a new command reuses. No server is started: the settings are read, not used (the calls
over mutual TLS are in tests/cluster/test_secure_cluster.py)."""

import argparse
import os

import pytest
import trustme

from twinflow.cli import build_parser
from twinflow.cli_common import (EXIT_BAD_FLOW, OPERATOR_ENV, _grpc_failure, _grpc_security, _load_flow,
                                 operator_security_flags)
from twinflow.cli_peer import cmd_status
from twinflow.grpc_security import GrpcSecurity, TlsFiles

FLOW = """\
flow: ops
uplink: {stream: uplink}
message: {id: id}
input: deliver
nodes:
  deliver: {type: action, sink: {stream: sink}}
  sort: {type: sort, pairs_with: deliver, key: seq, bake_time: 2}
security:
  tls: {cert: peer.pem, key: peer-key.pem, ca: ca.pem, mutual: true, server_name: peer.example}
  tokens: {admin: "env:TF_OPS_FILE_TOKEN", ingest: "env:TF_OPS_FILE_TOKEN", escalation: "env:TF_OPS_PEERS_ONLY"}
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a peer's certificate (named in the flow file) and an operator's, each with its key."""
    d = tmp_path_factory.mktemp("ops")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(d / "other-ca.pem"))
    for name, host in (("peer", "peer.example"), ("operator", "operator.example"), ("spare", "spare.example")):
        cert = ca.issue_cert(host)
        cert.private_key_pem.write_to_path(str(d / f"{name}-key.pem"))
        cert.cert_chain_pems[0].write_to_path(str(d / f"{name}.pem"))
    (d / "flow.yaml").write_text(FLOW)
    # The peers' flow file with a read token besides, in a variable the operator may not have.
    (d / "read-flow.yaml").write_text(FLOW.replace('escalation: "env:TF_OPS_PEERS_ONLY"}',
                                                   'escalation: "env:TF_OPS_PEERS_ONLY", read: "env:TF_OPS_READ"}'))
    return d


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    """No operator variable from the shell; the tokens the references name, but the escalation token
    only the peers have; GRPC_VERBOSITY put back."""
    for name in (*OPERATOR_ENV.values(), "GRPC_VERBOSITY", "TF_OPS_PEERS_ONLY", "TF_OPS_READ"):
        monkeypatch.setenv(name, "")  # so that the variable is put back as it was, even when unset
        monkeypatch.delenv(name)
    monkeypatch.setenv("TF_OPS_FILE_TOKEN", "from-the-file")
    monkeypatch.setenv("TF_OPS_ENV_TOKEN", "from-the-environment")
    monkeypatch.setenv("TF_OPS_FLAG_TOKEN", "from-the-flag")
    return monkeypatch


def security(pki, *argv, command="status", flow="flow.yaml") -> GrpcSecurity:
    args = build_parser().parse_args([*command.split(), str(pki / flow), *argv])
    if args.command == "failures":  # as the command asks: list and show only read
        return _grpc_security(args, _load_flow(args.flow), reads=args.action in ("list", "show"))
    return _grpc_security(args, _load_flow(args.flow))


def refusal(capsys, call) -> str:
    with pytest.raises(SystemExit) as exited:
        call()
    assert exited.value.code == EXIT_BAD_FLOW
    return capsys.readouterr().err


def test_without_flags_or_variables_the_flow_file_says(pki):
    sec = security(pki)
    assert os.environ["GRPC_VERBOSITY"] == "ERROR"  # the gRPC core's handshake lines left out
    assert (sec.tls.cert, sec.tls.key, sec.tls.ca) == (str(pki / "peer.pem"), str(pki / "peer-key.pem"),
                                                       str(pki / "ca.pem"))
    # Only the token the command sends is read: the escalation token's variable is not set here.
    assert sec.tls.server_name == "peer.example" and sec.tokens == {"admin": "from-the-file"}


@pytest.mark.parametrize("command", ["status", "handover"])
def test_a_flag_wins_over_its_variable_and_the_variable_over_the_flow_file(pki, environment, command):
    environment.setenv("TWINFLOW_TLS_CERT", str(pki / "operator.pem"))
    environment.setenv("TWINFLOW_TLS_KEY", str(pki / "operator-key.pem"))
    environment.setenv("TWINFLOW_TLS_CA", str(pki / "other-ca.pem"))
    environment.setenv("TWINFLOW_TLS_SERVER_NAME", "env.example")
    environment.setenv("TWINFLOW_TOKEN", "admin=env:TF_OPS_ENV_TOKEN, ingest=env:TF_OPS_ENV_TOKEN")
    from_env = security(pki, command=command)
    assert (from_env.tls.cert, from_env.tls.key) == (str(pki / "operator.pem"), str(pki / "operator-key.pem"))
    assert (from_env.tls.ca, from_env.tls.server_name) == (str(pki / "other-ca.pem"), "env.example")
    assert from_env.tokens == {"admin": "from-the-environment"}

    from_flags = security(pki, "--tls-cert", str(pki / "spare.pem"), "--tls-key", str(pki / "spare-key.pem"),
                          "--tls-ca", str(pki / "ca.pem"), "--tls-server-name", "flag.example",
                          "--token", "admin=env:TF_OPS_FLAG_TOKEN", command=command)
    assert (from_flags.tls.cert, from_flags.tls.key) == (str(pki / "spare.pem"), str(pki / "spare-key.pem"))
    assert (from_flags.tls.ca, from_flags.tls.server_name) == (str(pki / "ca.pem"), "flag.example")
    assert from_flags.tokens == {"admin": "from-the-flag"}


@pytest.mark.parametrize("argv, env, says", [
    (["--tls-cert", "{d}/operator.pem"], {}, "--tls-cert needs --tls-key"),
    (["--tls-key", "{d}/operator-key.pem"], {}, "--tls-key needs --tls-cert"),
    ([], {"TWINFLOW_TLS_CERT": "{d}/operator.pem"}, "TWINFLOW_TLS_CERT is set but TWINFLOW_TLS_KEY is not"),
    ([], {"TWINFLOW_TLS_KEY": "{d}/operator-key.pem"}, "TWINFLOW_TLS_KEY is set but TWINFLOW_TLS_CERT is not"),
    # A pair is taken whole from the flags: the variables' key does not complete a certificate flag.
    (["--tls-cert", "{d}/spare.pem"], {"TWINFLOW_TLS_CERT": "{d}/operator.pem",
                                      "TWINFLOW_TLS_KEY": "{d}/operator-key.pem"}, "--tls-cert needs --tls-key"),
], ids=["cert-flag", "key-flag", "cert-variable", "key-variable", "flag-and-variables"])
def test_half_a_certificate_pair_is_refused_naming_what_is_missing(pki, environment, capsys, argv, env, says):
    for name, value in env.items():
        environment.setenv(name, value.format(d=pki))
    argv = [a.format(d=pki) for a in argv]
    for command in ("status", "handover"):
        err = refusal(capsys, lambda: security(pki, *argv, command=command))
        assert f"twinflow: gRPC security settings refused: {says}" in err
        assert "a client certificate and its private key go together" in err


def test_status_refuses_half_a_pair_before_it_asks_redis(pki, capsys):
    """Also when Redis would answer and no gRPC call is made: a wrong setting shows before an outage."""
    args = build_parser().parse_args(["status", str(pki / "flow.yaml"), "--redis", "redis://127.0.0.1:1/0",
                                      "--tls-key", str(pki / "operator-key.pem")])
    assert "--tls-key needs --tls-cert" in refusal(capsys, lambda: cmd_status(args))


def test_tokens_in_the_variable_are_references_never_values(pki, environment, capsys):
    environment.setenv("TWINFLOW_TOKEN", "admin=hunter2-the-token")
    err = refusal(capsys, lambda: security(pki))
    assert "file:PATH or env:NAME" in err and "hunter2" not in err
    environment.setenv("TWINFLOW_TOKEN", "hunter2-the-token")  # no SCOPE=: a message-only exit, as --token's
    with pytest.raises(SystemExit) as exited:
        security(pki)
    assert "TWINFLOW_TOKEN: expected SCOPE=file:PATH or SCOPE=env:NAME" in str(exited.value.code)
    assert "hunter2" not in str(exited.value.code)
    environment.setenv("TWINFLOW_TOKEN", "root=env:TF_OPS_ENV_TOKEN")
    assert "unknown token scope 'root'" in refusal(capsys, lambda: security(pki))


def test_a_certificate_that_cannot_be_read_is_named_before_any_call(pki, capsys):
    err = refusal(capsys, lambda: security(pki, "--tls-cert", str(pki / "missing.pem"),
                                           "--tls-key", str(pki / "operator-key.pem")))
    assert f"cannot read {pki / 'missing.pem'}" in err


def test_run_keeps_its_serving_flags_and_reads_no_operator_variable(pki, environment):
    environment.setenv("TF_OPS_PEERS_ONLY", "escalation-token")  # a peer reads every scope's token
    environment.setenv("TWINFLOW_TLS_CERT", str(pki / "operator.pem"))
    environment.setenv("TWINFLOW_TLS_KEY", str(pki / "operator-key.pem"))
    environment.setenv("TWINFLOW_TOKEN", "admin=env:TF_OPS_ENV_TOKEN")
    args = build_parser().parse_args(["run", str(pki / "flow.yaml"), "--peer-id", "a", "--tls-mutual",
                                      "--insecure", "--token", "ingest=env:TF_OPS_FLAG_TOKEN"])
    sec = _grpc_security(args, _load_flow(args.flow))
    assert sec.tls.cert == str(pki / "peer.pem") and sec.tls.mutual and sec.insecure
    assert sec.tokens == {"admin": "from-the-file", "ingest": "from-the-flag", "escalation": "escalation-token"}


def test_a_new_command_reuses_the_two_helpers(pki, environment):
    """What a command added later (``failures``, ``resume``) does: its own subparser, the same options."""
    parser = argparse.ArgumentParser(prog="twinflow")
    sub = parser.add_subparsers(dest="command", required=True)
    later = sub.add_parser("later")
    later.add_argument("flow")
    operator_security_flags(later, scopes=("admin", "ingest"))  # it calls Admin and Ingest
    assert "TWINFLOW_TLS_CERT" in later.format_help() and "--tls-mutual" not in later.format_help()
    assert "the admin and ingest token this command sends" in " ".join(later.format_help().split())
    environment.setenv("TWINFLOW_TOKEN", "admin=env:TF_OPS_ENV_TOKEN")
    args = parser.parse_args(["later", str(pki / "flow.yaml"), "--tls-cert", str(pki / "operator.pem"),
                              "--tls-key", str(pki / "operator-key.pem")])
    sec = _grpc_security(args, _load_flow(args.flow))
    assert sec.tls.cert == str(pki / "operator.pem")
    # Tokens per scope: the variable's over the file's, the file's where the variable names none.
    assert sec.tokens == {"admin": "from-the-environment", "ingest": "from-the-file"}


READING, ACTING = ("status", "failures list", "failures show"), ("handover", "resume", "failures resubmit")


@pytest.mark.parametrize("command", READING + ACTING)
def test_a_command_that_only_reads_sends_the_read_token_when_one_is_named(pki, environment, command):
    """The least token that suffices: read for status and failures list/show when the operator's
    settings (else the flow file) name one, else admin; the commands that act read and send admin
    alone, whatever read token is named."""
    reads = command in READING
    environment.setenv("TF_OPS_READ", "read-from-the-file")
    assert security(pki, command=command, flow="read-flow.yaml").tokens == \
        ({"read": "read-from-the-file"} if reads else {"admin": "from-the-file"})
    environment.setenv("TWINFLOW_TOKEN", "read=env:TF_OPS_ENV_TOKEN")
    assert security(pki, command=command, flow="read-flow.yaml").tokens == \
        ({"read": "from-the-environment"} if reads else {"admin": "from-the-file"})
    # Both named by the operator: read for reading (its flag over the variable's), admin for acting.
    both = security(pki, "--token", "admin=env:TF_OPS_FLAG_TOKEN", "--token", "read=env:TF_OPS_FLAG_TOKEN",
                    command=command, flow="read-flow.yaml")
    assert both.tokens == ({"read": "from-the-flag"} if reads else {"admin": "from-the-flag"})
    # The operator names an admin token only: the flow file's read token is never opened (its
    # variable unset here would end the command), so an operator's own admin token still works.
    environment.delenv("TF_OPS_READ")
    environment.setenv("TWINFLOW_TOKEN", "admin=env:TF_OPS_ENV_TOKEN")
    assert security(pki, command=command, flow="read-flow.yaml").tokens == {"admin": "from-the-environment"}
    # A flow file with no read token: admin, as before the read scope.
    environment.delenv("TWINFLOW_TOKEN")
    assert security(pki, command=command).tokens == {"admin": "from-the-file"}


def test_the_token_help_says_which_commands_send_read(pki):
    def token_help(command: str) -> str:
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "command").choices[command]
        return " ".join(next(a for a in sub._actions if a.dest == "token").help.split())

    assert token_help("status").startswith("the admin (or read) token this command sends")
    assert "the calls that only read send the read token when one is given" in token_help("failures")
    assert token_help("handover").startswith("the admin token this command sends") and "read" not in \
        token_help("handover")
    assert token_help("publish").startswith("the ingest token")
    run_help = " ".join(next(a for a in next(a for a in build_parser()._actions if a.dest == "command")
                             .choices["run"]._actions if a.dest == "token").help.split())
    assert "ingest, escalation, admin or read" in run_help


class _Refused(Exception):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_a_closed_handshake_says_what_to_pass():
    import grpc

    closed = _Refused(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: "
                                                   "UNAVAILABLE: ipv4:127.0.0.1:7070: Socket closed")
    no_cert = _grpc_failure("127.0.0.1:7070", closed, GrpcSecurity(tls=TlsFiles(ca="ca.pem")))
    assert no_cert.startswith("twinflow: peer at 127.0.0.1:7070 did not answer: UNAVAILABLE: failed to connect")
    assert "pass --tls-cert and --tls-key, or set TWINFLOW_TLS_CERT and TWINFLOW_TLS_KEY" in no_cert
    assert "pass --tls-ca" in _grpc_failure("127.0.0.1:7070", closed, GrpcSecurity())
    refused = _Refused(grpc.StatusCode.UNAUTHENTICATED, "no bearer token for admin")
    assert _grpc_failure("h:1", refused, GrpcSecurity()) == \
        "twinflow: peer at h:1 did not answer: UNAUTHENTICATED: no bearer token for admin"
