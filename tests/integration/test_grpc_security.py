"""gRPC security on real sockets: TLS, mutual TLS, per-scope tokens (the read scope that may
look but not act among them), the bind guard, health, reflection, size limits, and random
input that must leave a peer up and its uplink clean.

Certificates come from a throw-away CA made by ``trustme``; every server binds
127.0.0.1 (TLS on loopback), except the bind-guard checks, which only try to
bind 0.0.0.0 and are refused before listening, or bind it for a moment
with ``insecure``.
"""

import json
import threading

import grpc
import pytest
import redis
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twinflow.cluster.escalation_servicer import EscalationServicer
from twinflow.cluster.grpc_server import AdminServicer, IngestServicer, create_server
from twinflow.cluster.health import PeerHealth
from twinflow.client import Client
from twinflow.cluster.flow_failures import FlowFailures
from twinflow.grpc_security import (READ_METHODS, REQUIRED_SCOPES, SCOPES, GrpcSecurity, SecurityConfigError, TlsFiles,
                                    TokenCheck, scope_of, scopes_of, token_fingerprint, warn_insecure)
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc

TOKENS = {"ingest": "ingest-token", "escalation": "escalation-token", "admin": "admin-token"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(d / "server-key.pem"))
    server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    client = ca.issue_cert("node-b.example")
    client.private_key_pem.write_to_path(str(d / "client-key.pem"))
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    return d


def serve(security, health=None, **servicers):
    admin = servicers.pop("admin", AdminServicer(status=lambda: {"flow": "f", "role": "worker"},
                                                  handover=lambda t: {"ok": False, "reason": "not master"}))
    server, port = create_server("127.0.0.1:0", admin=admin, security=security, health=health, **servicers)
    return server, f"127.0.0.1:{port}"


def status_code(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_tls_and_tokens_per_scope(pki):
    server_side = GrpcSecurity(tls=TlsFiles(cert=str(pki / "server.pem"), key=str(pki / "server-key.pem")),
                               tokens=TOKENS)
    server, address = serve(server_side, ingest=IngestServicer("f", lambda bodies, d: ["1-0"] * len(bodies)))
    try:
        def client(token_scope_value: dict) -> GrpcSecurity:
            return GrpcSecurity(tls=TlsFiles(ca=str(pki / "ca.pem")), tokens=token_scope_value)

        def status(security):
            with security.channel(address, "admin") as ch:
                return pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5)

        assert status(client({"admin": "admin-token"})).role == "worker"
        assert status_code(lambda: status(client({}))) == grpc.StatusCode.UNAUTHENTICATED
        assert status_code(lambda: status(client({"admin": "guess"}))) == grpc.StatusCode.UNAUTHENTICATED
        # A valid token of another scope: known, but not allowed here.
        assert status_code(lambda: status(client({"admin": "ingest-token"}))) == grpc.StatusCode.PERMISSION_DENIED
        # Plain text to the TLS port never reaches a service.
        assert status_code(lambda: status(GrpcSecurity(tokens={"admin": "admin-token"}))) == \
            grpc.StatusCode.UNAVAILABLE
        with client({"ingest": "ingest-token"}).channel(address, "ingest") as ch:
            reply = pb_grpc.IngestStub(ch).Publish(pb.PublishRequest(flow="f", messages=[pb.Envelope(body=b"{}")]),
                                                   timeout=5)
        assert list(reply.positions) == ["1-0"]
    finally:
        server.stop(None).wait()


def test_mutual_tls_refuses_a_client_without_a_certificate(pki):
    tls = TlsFiles(cert=str(pki / "server.pem"), key=str(pki / "server-key.pem"), ca=str(pki / "ca.pem"),
                   mutual=True)
    server, address = serve(GrpcSecurity(tls=tls))
    try:
        def status(client_tls):
            with GrpcSecurity(tls=client_tls).channel(address, "admin") as ch:
                return pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5)

        with_cert = TlsFiles(cert=str(pki / "client.pem"), key=str(pki / "client-key.pem"), ca=str(pki / "ca.pem"))
        assert status(with_cert).role == "worker"
        assert status_code(lambda: status(TlsFiles(ca=str(pki / "ca.pem")))) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None).wait()


def test_a_non_loopback_bind_needs_tls_and_tokens_or_insecure(pki, caplog):
    tls = TlsFiles(cert=str(pki / "server.pem"), key=str(pki / "server-key.pem"))
    with pytest.raises(SecurityConfigError, match="without TLS"):
        create_server("0.0.0.0:0", security=GrpcSecurity(tokens=TOKENS))
    with pytest.raises(SecurityConfigError, match="without a token for escalation, admin"):
        create_server("0.0.0.0:0", security=GrpcSecurity(tls=tls, tokens={"ingest": "x"}))
    with pytest.raises(SecurityConfigError, match="tls.key: cannot read /k.pem"):
        create_server("127.0.0.1:0", security=GrpcSecurity(tls=TlsFiles(cert="/nonexistent.pem", key="/k.pem")))
    server, _ = create_server("0.0.0.0:0", security=GrpcSecurity(insecure=True))
    server.stop(None).wait()
    # The warning: at start and then once per interval (the wait is the test's, not a clock's).
    stop, rounds = threading.Event(), []
    with caplog.at_level("WARNING", logger="twinflow.security"):
        warn_insecure("0.0.0.0:7070", stop, every_s=60.0,
                      wait=lambda s: rounds.append(s) or len(rounds) == 3).join(timeout=5)
    warnings = [r for r in caplog.records if "--insecure" in r.getMessage()]
    assert len(warnings) == 3 and rounds == [60.0, 60.0, 60.0]


def test_health_per_service_and_reflection_without_a_token():
    health = PeerHealth()
    server, address = serve(GrpcSecurity(tokens=TOKENS), health=health.servicer,
                            escalation=EscalationServicer("f", lambda e, c: 0))
    try:
        with grpc.insecure_channel(address) as ch:
            check = health_pb2_grpc.HealthStub(ch).Check

            def status_of(service):
                return check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

            serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
            assert status_of("twinflow.wire.Admin") == serving
            assert status_of("twinflow.wire.Ingest") == not_serving
            health.streaming(True)
            assert status_of("twinflow.wire.Ingest") == serving and status_of("") == serving
            health.stopping()
            assert status_of("twinflow.wire.Escalation") == not_serving

            reflect = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo
            replies = list(reflect(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
            names = {s.name for s in replies[0].list_services_response.service}
            assert {"twinflow.wire.Admin", "twinflow.wire.Escalation", "grpc.health.v1.Health"} <= names
    finally:
        server.stop(None).wait()


@pytest.fixture
def ingest_node(redis_url, flow_name):
    """A peer's server over a real uplink: Ingest writes into Redis, with tokens."""
    client = redis.Redis.from_url(redis_url)
    store = FlowStore(client, FlowKeys(flow_name, "uplink", "sink"), "n1")
    server, port = create_server(
        "127.0.0.1:0", ingest=IngestServicer(flow_name, store.publish, max_batch=100),
        escalation=EscalationServicer(flow_name, lambda e, c: len(c), admit=lambda peer, epoch: "not the master"),
        admin=AdminServicer(lambda: {"flow": flow_name}, lambda t: {"ok": False}),
        security=GrpcSecurity(tokens={**TOKENS, "read": "read-token"}), max_message_bytes=64 * 1024)
    try:
        yield f"127.0.0.1:{port}", client, store.keys.uplink
    finally:
        server.stop(None).wait()
        client.close()


def test_refusals_have_their_status_codes(ingest_node, flow_name):
    address, r, uplink = ingest_node
    sec = GrpcSecurity(tokens=TOKENS)
    with sec.channel(address, "ingest") as ch:
        publish = pb_grpc.IngestStub(ch).Publish

        def send(flow, bodies):
            return publish(pb.PublishRequest(flow=flow, messages=[pb.Envelope(body=b) for b in bodies]), timeout=5)

        assert status_code(lambda: send("other", [b"{}"])) == grpc.StatusCode.INVALID_ARGUMENT
        assert status_code(lambda: send(flow_name, [b"{}"] * 101)) == grpc.StatusCode.INVALID_ARGUMENT
        assert status_code(lambda: send(flow_name, [b"x" * 70_000])) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert r.xlen(uplink) == 0
        assert len(send(flow_name, [b'{"id": "ok"}']).positions) == 1
    with sec.channel(address, "escalation") as ch:
        acks = list(pb_grpc.EscalationStub(ch).Escalate(iter([pb.EscalationBatch(
            flow=flow_name, from_node="x", epoch=99, seq=1, claims=[pb.Envelope(id="a", key="1", position="1-0")])]),
            timeout=5))
    assert not acks[0].accepted and acks[0].reason == "not the master"
    with sec.channel(address, "escalation") as ch:
        too_many = [pb.Envelope() for _ in range(10_001)]  # small: under the 64 KiB request limit here
        acks = list(pb_grpc.EscalationStub(ch).Escalate(iter([pb.EscalationBatch(
            flow=flow_name, from_node="x", epoch=99, seq=2, claims=too_many)]), timeout=5))
    assert not acks[0].accepted and acks[0].reason == "10001 claims in one batch; at most 10000"


METHODS = ("/twinflow.wire.Ingest/Publish", "/twinflow.wire.Admin/Status", "/twinflow.wire.Admin/Handover",
           "/twinflow.wire.Escalation/Escalate")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(METHODS),
       shape=st.one_of(st.binary(max_size=2048),
                       st.tuples(st.sampled_from(["this flow", "other", ""]), st.lists(st.binary(max_size=64),
                                                                                      max_size=5))),
       token=st.sampled_from([None, "ingest-token", "admin-token", "escalation-token", "read-token", "wrong"]))
def test_random_input_to_every_rpc_leaves_the_node_up_and_the_uplink_clean(ingest_node, flow_name, method,
                                                                           shape, token):
    """Random bytes (most not a valid message at all) or random envelopes, with any token:
    every call ends with a status, the peer answers Status afterwards, and the uplink gains
    entries only for a Publish that carried the ingest token and named this flow."""
    address, r, uplink = ingest_node
    if isinstance(shape, bytes):
        payload = shape
    else:
        flow = flow_name if shape[0] == "this flow" else shape[0]
        envelopes = [pb.Envelope(id=f"e{i}", key=str(i), position="1-0", body=b) for i, b in enumerate(shape[1])]
        message = (pb.EscalationBatch(flow=flow, from_node="x", epoch=1, seq=1, claims=envelopes)
                   if method.endswith("Escalate") else pb.PublishRequest(flow=flow, messages=envelopes))
        payload = message.SerializeToString()
    before = r.xlen(uplink)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as ch:
        if method.endswith("Escalate"):
            call = ch.stream_stream(method, request_serializer=None, response_deserializer=None)
            try:
                list(call(iter([payload]), metadata=metadata, timeout=5))
            except grpc.RpcError as exc:
                assert exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                call(payload, metadata=metadata, timeout=5)
            except grpc.RpcError as exc:
                assert exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED
        status = pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5,
                                              metadata=[("authorization", "Bearer admin-token")])
        assert status.flow == flow_name
    added = r.xlen(uplink) - before
    if not (method.endswith("Publish") and token == "ingest-token"):
        assert added == 0
    else:
        try:
            request = pb.PublishRequest.FromString(payload)
        except Exception:
            request = None
        expected = len(request.messages) if request is not None and request.flow == flow_name else 0
        assert added == expected
        if added:
            got = [e[1][b"data"] for e in r.xrange(uplink, count=before + added)[before:]]
            assert got == [m.body for m in request.messages]


def test_flow_file_tokens_are_references_never_values(tmp_path):
    from twinflow.runtime.flowgraph import FlowFileError, parse_graph

    text = ("flow: f\nuplink: {stream: u}\ninput: d\nnodes:\n  d: {type: action, sink: {stream: s}}\n"
            "security:\n  tokens: {admin: %s}\n")
    with pytest.raises(FlowFileError) as info:
        parse_graph(text % "hunter2-the-token", str(tmp_path / "f.yaml"))
    assert "file:PATH or env:NAME" in str(info.value) and "hunter2" not in str(info.value)
    (tmp_path / "admin.token").write_text("s3cret\n")
    graph = parse_graph(text % "file:admin.token", str(tmp_path / "f.yaml"))
    assert dict(graph.cluster.security.tokens) == {"admin": f"file:{tmp_path / 'admin.token'}"}
    sec = GrpcSecurity.from_refs(token_refs=dict(graph.cluster.security.tokens))
    assert sec.tokens == {"admin": "s3cret"}
    assert json.dumps(dict(graph.cluster.security.tokens)).count("s3cret") == 0


def test_twinflow_run_refuses_a_public_bind_without_tls_before_starting(tmp_path):
    """The guard runs before Spark, Redis or ZooKeeper are touched (their addresses here lead nowhere)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "twinflow.cli", "run", "examples/cluster.yaml", "--peer-id", "x",
            "--redis", "redis://127.0.0.1:1/0", "--zk", "127.0.0.1:1", "--listen", "0.0.0.0:0",
            "--state-dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert "refusing to serve gRPC on 0.0.0.0:0 without TLS" in done.stderr
    bad_ref = subprocess.run(argv[:-4] + ["--token", "admin=hunter2", "--state-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
    assert bad_ref.returncode == 2 and "hunter2" not in bad_ref.stderr
    assert "file:PATH or env:NAME" in bad_ref.stderr


def test_twinflow_certs_makes_what_a_mutual_tls_pair_needs(tmp_path):
    """`twinflow certs` twice (two peers, one CA): peer a serves with its files, peer b's client
    certificate and the admin token it wrote get in; the key and token files are private."""
    import os
    import stat
    import subprocess
    import sys

    for peer, flag in (("node-a", "--peer"), ("node-b", "--node")):  # --node: the flag's other name
        done = subprocess.run([sys.executable, "-m", "twinflow.cli", "certs", str(tmp_path), flag, peer,
                               "--name", "127.0.0.1", "--name", "localhost"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert ("--node is deprecated, use --peer" in done.stderr) == (flag == "--node")
    assert stat.S_IMODE(os.stat(tmp_path / "node-a-key.pem").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "admin.token").st_mode) == 0o600
    refs = {s: f"file:{tmp_path / f'{s}.token'}" for s in ("ingest", "escalation", "admin")}

    def files(peer):
        return TlsFiles(cert=str(tmp_path / f"{peer}.pem"), key=str(tmp_path / f"{peer}-key.pem"),
                        ca=str(tmp_path / "ca.pem"), mutual=True)

    server, address = serve(GrpcSecurity.from_refs(files("node-a"), refs))
    try:
        with GrpcSecurity.from_refs(files("node-b"), refs).channel(address, "admin") as ch:
            assert pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5).role == "worker"
        stranger = trustme.CA().issue_cert("127.0.0.1")  # a certificate from another CA
        stranger.private_key_pem.write_to_path(str(tmp_path / "x-key.pem"))
        stranger.cert_chain_pems[0].write_to_path(str(tmp_path / "x.pem"))
        other = TlsFiles(cert=str(tmp_path / "x.pem"), key=str(tmp_path / "x-key.pem"), ca=str(tmp_path / "ca.pem"))
        with GrpcSecurity.from_refs(other, refs).channel(address, "admin") as ch:
            assert status_code(lambda: pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5)) == \
                grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None).wait()


# -- rotation: several tokens per scope, a bundle of CAs ---------------------------------------

def admin_status(address: str, token: str | None, security: GrpcSecurity | None = None):
    """Status with ``token`` as the bearer (None: none), over ``security``'s TLS if given."""
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with (security or GrpcSecurity()).channel(address, "admin") as ch:
        return pb_grpc.AdminStub(ch).Status(pb.StatusRequest(), timeout=5, metadata=metadata)


def token_metric(server, name: str = "twinflow_grpc_accepted_not_first_total", label: str = "scope") -> dict:
    """A token check's counter (default twinflow_grpc_accepted_not_first_total) by ``label``, as a
    peer's scrape serves it for ``server``."""
    from types import SimpleNamespace

    from twinflow.cluster.metrics import PeerCollector

    # A member with nothing to read: its own metrics are left out (and logged), the server's stay.
    member = SimpleNamespace(name="f", cfg=SimpleNamespace(peer_id="a"))
    return {s.labels[label]: s.value for family in PeerCollector(lambda: [member], server=lambda: server).collect()
            for s in family.samples if s.name == name}


def test_a_token_file_of_several_lines_is_accepted_whole_and_its_first_line_is_sent(tmp_path):
    """A rotation's overlap: the admin file holds [old, new], so the server takes both and refuses a
    third; a caller sends its file's first line; with only [new] after a restart, old is refused."""
    for scope in ("ingest", "escalation"):
        (tmp_path / f"{scope}.token").write_text(f"{scope}-token\n")
    admin = tmp_path / "admin.token"
    admin.write_text("old-token\n\n  new-token  \n")
    refs = {s: f"file:{tmp_path / f'{s}.token'}" for s in ("ingest", "escalation", "admin")}
    server, address = serve(GrpcSecurity.from_refs(token_refs=refs))
    try:
        check = server.token_check
        assert admin_status(address, "old-token").role == "worker"
        assert admin_status(address, "new-token").role == "worker"
        assert status_code(lambda: admin_status(address, "third-token")) == grpc.StatusCode.UNAUTHENTICATED
        assert status_code(lambda: admin_status(address, "ingest-token")) == grpc.StatusCode.PERMISSION_DENIED
        assert check.refused == {"unauthenticated": 1, "permission_denied": 1}
        assert check.accepted_not_first == {"ingest": 0, "escalation": 0, "admin": 1}  # new-token, once
        # A caller whose file has new first sends new (counted as not first here); one with old first, old.
        caller_file = tmp_path / "caller.token"
        caller_file.write_text("new-token\nold-token\n")
        caller = GrpcSecurity.from_refs(token_refs={"admin": f"file:{caller_file}"})
        assert caller.tokens == {"admin": "new-token"} and caller.accepted("admin") == ("new-token", "old-token")
        assert admin_status(address, None, caller).role == "worker"
        assert check.accepted_not_first["admin"] == 2
        assert admin_status(address, None, GrpcSecurity.from_refs(token_refs={"admin": f"file:{admin}"})).role
        assert check.accepted_not_first["admin"] == 2
        assert token_metric(server) == {"ingest": 0, "escalation": 0, "admin": 2}
        assert token_metric(server, "twinflow_grpc_refused_total", "reason") == {"unauthenticated": 1,
                                                                                "permission_denied": 1}
    finally:
        server.stop(None).wait()

    admin.write_text("new-token\n")  # the old line gone; the peer reads it at its next start
    server, address = serve(GrpcSecurity.from_refs(token_refs=refs))
    try:
        assert admin_status(address, "new-token").role == "worker"
        with pytest.raises(grpc.RpcError) as refused:
            admin_status(address, "old-token")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == ("the bearer token is not valid for admin "
                                           "(send 'authorization: Bearer <token>')")
        assert server.token_check.refused == {"unauthenticated": 1, "permission_denied": 0}
        assert server.token_check.accepted_not_first["admin"] == 0
    finally:
        server.stop(None).wait()


def test_status_over_grpc_checks_the_operators_token(tmp_path, monkeypatch, capsys):
    """`twinflow status --grpc --peer`: the rotation's check, answered with the new token and
    refused (exit 3, UNAUTHENTICATED) with the old one once the peer accepts only the new."""
    from twinflow.cli import build_parser
    from twinflow.cli_common import OPERATOR_ENV

    for name in (*OPERATOR_ENV.values(), "GRPC_VERBOSITY"):
        monkeypatch.setenv(name, "")  # put back as it was after the test, even when unset
        monkeypatch.delenv(name)
    flow = tmp_path / "flow.yaml"
    flow.write_text("flow: f\nuplink: {stream: u}\nmessage: {id: id}\ninput: d\nnodes:\n"
                    "  d: {type: action, sink: {stream: s}}\n  sort: {type: sort, pairs_with: d, key: k, "
                    "bake_time: 2}\n")
    (tmp_path / "old.token").write_text("old-token\n")
    (tmp_path / "new.token").write_text("new-token\nold-token\n")  # the operator's file mid-rotation
    server, address = serve(GrpcSecurity(tokens={"admin": "new-token"}))
    try:
        def status(token_file: str) -> int:
            args = build_parser().parse_args(["status", str(flow), "--grpc", "--peer", address,
                                              "--token", f"admin=file:{tmp_path / token_file}"])
            return args.fn(args)

        assert status("new.token") == 0
        assert "worker" in capsys.readouterr().out
        assert status("old.token") == 3
        err = capsys.readouterr().err
        assert f"peer at {address} did not answer: UNAUTHENTICATED: the bearer token is not valid" in err
        assert "old-token" not in err
    finally:
        server.stop(None).wait()


@pytest.fixture(scope="module")
def two_cas(tmp_path_factory):
    """Two CAs made by `twinflow certs` (old/ and new/), each with a peer's certificate for 127.0.0.1
    and a client's; and both.pem, old's CA then new's."""
    from twinflow.certs import make_certs

    d = tmp_path_factory.mktemp("rotation")
    for ca in ("old", "new"):
        make_certs(d / ca, "peer", ["127.0.0.1"])
        make_certs(d / ca, "client", ["client.example"])
    (d / "both.pem").write_bytes((d / "old" / "ca.pem").read_bytes() + (d / "new" / "ca.pem").read_bytes())
    return d


def test_a_ca_bundle_trusts_either_ca_and_the_new_ca_alone_refuses_the_old(two_cas):
    d = two_cas

    def peer(ca_dir: str, ca: str) -> TlsFiles:  # serves (and is a client) with ca_dir's certificate
        return TlsFiles(cert=str(d / ca_dir / "peer.pem"), key=str(d / ca_dir / "peer-key.pem"), ca=ca, mutual=True)

    def client(ca_dir: str, ca: str) -> GrpcSecurity:
        return GrpcSecurity(tls=TlsFiles(cert=str(d / ca_dir / "client.pem"), key=str(d / ca_dir / "client-key.pem"),
                                         ca=ca))

    both, new_ca = str(d / "both.pem"), str(d / "new" / "ca.pem")
    # The overlap: every side trusts both CAs, whichever signed the server's and the client's.
    for server_cert in ("old", "new"):
        server, address = serve(GrpcSecurity(tls=peer(server_cert, both)))
        try:
            for client_cert in ("old", "new"):
                assert admin_status(address, None, client(client_cert, both)).role == "worker", \
                    (server_cert, client_cert)
        finally:
            server.stop(None).wait()
    # The end: the new CA alone. A client signed by the old CA is refused in the handshake...
    server, address = serve(GrpcSecurity(tls=peer("new", new_ca)))
    try:
        assert admin_status(address, None, client("new", new_ca)).role == "worker"
        assert status_code(lambda: admin_status(address, None, client("old", both))) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None).wait()
    # ... and so is a server whose certificate the old CA signed, by a client that trusts only the new.
    server, address = serve(GrpcSecurity(tls=peer("old", both)))
    try:
        assert status_code(lambda: admin_status(address, None, client("new", new_ca))) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None).wait()


def test_twinflow_certs_signs_with_the_bundles_ca_that_has_the_key(two_cas, tmp_path):
    """A CA directory whose ca.pem became a bundle still signs with its own CA; a ca.pem without
    the key's certificate is refused before anything is written."""
    import shutil

    from cryptography import x509

    from twinflow.certs import CertsError, make_certs

    d = tmp_path / "ca"
    shutil.copytree(two_cas / "new", d)
    (d / "ca.pem").write_bytes((two_cas / "both.pem").read_bytes())
    make_certs(d, "peer-c", ["127.0.0.1"])
    issued = x509.load_pem_x509_certificate((d / "peer-c.pem").read_bytes())
    new_ca = x509.load_pem_x509_certificate((two_cas / "new" / "ca.pem").read_bytes())
    issued.verify_directly_issued_by(new_ca)
    (d / "ca.pem").write_bytes((two_cas / "old" / "ca.pem").read_bytes())
    with pytest.raises(CertsError, match="holds no certificate for the key"):
        make_certs(d, "peer-d", ["127.0.0.1"])
    assert not (d / "peer-d.pem").exists()


# -- the read scope: look, never act ------------------------------------------------------------

def test_each_method_takes_its_services_scope_and_only_the_reading_ones_take_read_too():
    """Every method of the proto: Status and Failures take read or admin, every other method its
    service's scope alone (a method added later too); health and reflection take none."""
    found = {}
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            found[f"/{service.full_name}/{method.name}"] = scopes_of(f"/{service.full_name}/{method.name}")
    assert found == {
        "/twinflow.wire.Escalation/Escalate": ("escalation",),
        "/twinflow.wire.Ingest/Publish": ("ingest",),
        "/twinflow.wire.Ingest/Notices": ("ingest",),
        "/twinflow.wire.Admin/Status": ("read", "admin"),
        "/twinflow.wire.Admin/Handover": ("admin",),
        "/twinflow.wire.Admin/Resume": ("admin",),
        "/twinflow.wire.Admin/Failures": ("read", "admin"),
        "/twinflow.wire.Admin/Resubmit": ("admin",),
        "/twinflow.wire.Admin/Discard": ("admin",),
    }
    assert READ_METHODS <= set(found)  # no name in it that the proto does not have
    assert scopes_of("twinflow.wire.Admin/Status") == ("read", "admin")  # the leading "/" optional
    assert scopes_of("/twinflow.wire.Admin/Later") == ("admin",) and scope_of("/twinflow.wire.Admin/Status") == "admin"
    assert scopes_of("/grpc.health.v1.Health/Check") == () and scope_of("/grpc.health.v1.Health/Check") is None
    assert set(SCOPES) - set(REQUIRED_SCOPES) == {"read"}


def test_which_token_a_caller_sends_the_least_that_suffices():
    status, handover = "/twinflow.wire.Admin/Status", "/twinflow.wire.Admin/Handover"
    both = GrpcSecurity(tokens={"read": "r", "admin": "a"})
    assert (both.scope_to_send(status), both.scope_to_send(handover)) == ("read", "admin")
    admin_only = GrpcSecurity(tokens={"admin": "a"})
    assert admin_only.scope_to_send(status) == "admin"
    read_only = GrpcSecurity(tokens={"read": "r"})
    # No admin token: the service's own scope, for which none goes (the peer then names what it needs).
    assert (read_only.scope_to_send(status), read_only.scope_to_send(handover)) == ("read", "admin")
    assert GrpcSecurity().scope_to_send("/twinflow.wire.Ingest/Notices") == "ingest"
    with pytest.raises(ValueError, match="served without a token"):
        both.scope_to_send("/grpc.health.v1.Health/Check")


def test_scopes_for_and_the_fingerprint_of_a_token():
    """A console's check of an HTTP request's token: every scope that accepts it, rotation lines too."""
    sec = GrpcSecurity(tokens={**TOKENS, "read": "read-new"},
                       accepted_tokens={"read": ("read-new", "read-old"), "admin": ("admin-token", "shared")})
    assert sec.scopes_for("read-old") == frozenset({"read"})
    assert sec.scopes_for("admin-token") == frozenset({"admin"})
    assert sec.scopes_for("read-newer") == sec.scopes_for("") == sec.scopes_for("ré") == frozenset()
    same = GrpcSecurity(tokens={"read": "one-secret", "admin": "one-secret"})  # allowed: the same secret twice
    assert same.scopes_for("one-secret") == frozenset({"read", "admin"})
    assert GrpcSecurity().scopes_for("anything") == frozenset()
    fingerprint = token_fingerprint("read-new")
    assert fingerprint == token_fingerprint("read-new") != token_fingerprint("read-old")
    assert fingerprint.startswith("sha256:") and len(fingerprint) == len("sha256:") + 8 and "read" not in fingerprint



def test_a_secured_peer_needs_no_read_token_and_from_refs_takes_one(tmp_path):
    tls = TlsFiles(cert=str(tmp_path / "server.pem"), key=str(tmp_path / "server-key.pem"))  # not read by the check
    GrpcSecurity(tls=tls, tokens=TOKENS).check_bind("0.0.0.0:7070")  # a deployment made before the read scope
    with pytest.raises(SecurityConfigError, match="without a token for admin:"):
        GrpcSecurity(tls=tls, tokens={"ingest": "i", "escalation": "e", "read": "r"}).check_bind("0.0.0.0:7070")
    (tmp_path / "read.token").write_text("read-new\nread-old\n")
    sec = GrpcSecurity.from_refs(token_refs={"read": f"file:{tmp_path / 'read.token'}"})
    assert sec.tokens == {"read": "read-new"} and sec.accepted("read") == ("read-new", "read-old")
    with pytest.raises(SecurityConfigError, match="the scopes are ingest, escalation, admin, read"):
        GrpcSecurity.from_refs(token_refs={"reader": "env:X"})


def test_the_flow_file_names_a_read_token(tmp_path):
    from twinflow.runtime.flowgraph import FlowFileError, parse_graph

    text = ("flow: f\nuplink: {stream: u}\ninput: d\nnodes:\n  d: {type: action, sink: {stream: s}}\n"
            "security:\n  tokens: {admin: file:admin.token, read: %s}\n")
    graph = parse_graph(text % "file:read.token", str(tmp_path / "f.yaml"))
    assert dict(graph.cluster.security.tokens) == {"admin": f"file:{tmp_path / 'admin.token'}",
                                                   "read": f"file:{tmp_path / 'read.token'}"}
    with pytest.raises(FlowFileError) as info:
        parse_graph(text % "hunter2-the-token", str(tmp_path / "f.yaml"))
    assert "file:PATH or env:NAME" in str(info.value) and "hunter2" not in str(info.value)


@pytest.fixture
def read_node(redis_url, flow_name):
    """A peer's server over a real Redis, with every scope's token; the read file mid-rotation
    (read-new first, read-old still accepted)."""
    client = redis.Redis.from_url(redis_url)
    store = FlowStore(client, FlowKeys(flow_name, "uplink", "sink"), "n1")
    failures = FlowFailures(flow_name, [store])
    handed = []
    server, port = create_server(
        "127.0.0.1:0", ingest=IngestServicer(flow_name, store.publish, failures=lambda: failures),
        escalation=EscalationServicer(flow_name, lambda e, c: len(c), admit=lambda peer, epoch: "not the master"),
        admin=AdminServicer(lambda: {"flow": flow_name, "role": "master"},
                            lambda t: handed.append(t) or {"ok": True, "new_master": "b"},
                            failures=lambda: failures, resume=lambda by: handed.append(by) or []),
        security=GrpcSecurity(tokens={**TOKENS, "read": "read-new"},
                              accepted_tokens={"read": ("read-new", "read-old")}))
    try:
        yield server, f"127.0.0.1:{port}", client, store.keys.uplink, handed
    finally:
        server.stop(None).wait()
        client.close()


def test_a_read_token_looks_but_may_not_act(read_node, flow_name):
    """A read token calls Status and Failures (list and show); on every method that acts it is a
    known token of a scope the method does not take: PERMISSION_DENIED, and nothing was done."""
    server, address, r, uplink, handed = read_node
    check = server.token_check
    reader = GrpcSecurity(tokens={"read": "read-new"})
    with Client(address, flow_name, reader) as client:
        assert client.status()["role"] == "master" and client.statuses()[address]["flow"] == flow_name
        assert client.failures(status="ANY") == []
        with pytest.raises(grpc.RpcError) as missing:
            client.failure("1-0")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND  # past the token check, in the audit
        # The client holds no admin token: it sends none, and the peer names the token it needs.
        with pytest.raises(grpc.RpcError) as no_admin:
            client.resubmit(["1-0"])
        assert no_admin.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert no_admin.value.details().startswith("no bearer token for admin")
    assert check.refused == {"unauthenticated": 1, "permission_denied": 0}

    # The read token where an admin or ingest token goes (a misfiled token, or one sent on purpose).
    as_admin = GrpcSecurity(tokens={"admin": "read-new", "ingest": "read-new", "escalation": "read-new"})
    with Client(address, flow_name, as_admin, retry_unavailable=False) as client:
        assert client.status()["role"] == "master"  # Status takes it, whatever the caller calls it
        for act in (lambda: client.handover(), lambda: client.resume(by="x"),
                    lambda: client.resubmit(["1-0"], by="x"), lambda: client.discard(all_matching=True, by="x"),
                    lambda: client.publish([{"id": "m1"}]), lambda: client.notices("shop")):
            with pytest.raises(grpc.RpcError) as refused:
                act()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with as_admin.channel(address, "escalation") as ch:
        assert status_code(lambda: list(pb_grpc.EscalationStub(ch).Escalate(
            iter([pb.EscalationBatch(flow=flow_name, from_node="x", epoch=1, seq=1)]), timeout=5))) == \
            grpc.StatusCode.PERMISSION_DENIED
    assert handed == [] and r.xlen(uplink) == 0
    assert check.refused == {"unauthenticated": 1, "permission_denied": 7}
    with pytest.raises(grpc.RpcError) as denied:
        request_handover_with(address, "read-new")
    assert denied.value.details() == "this token may not call twinflow.wire.Admin/Handover (it takes the admin token)"

    # The old line of a rotating read file is still taken, and counted under read.
    assert admin_status(address, "read-old").role == "master"
    assert check.accepted_not_first == {"ingest": 0, "escalation": 0, "admin": 0, "read": 1}
    assert token_metric(server) == {"ingest": 0, "escalation": 0, "admin": 0, "read": 1}
    with pytest.raises(grpc.RpcError) as wrong:
        admin_status(address, "read-older")
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert wrong.value.details() == ("the bearer token is not valid for read or admin "
                                     "(send 'authorization: Bearer <token>')")

    # The admin token still does everything, reading included.
    with Client(address, flow_name, GrpcSecurity(tokens={"admin": "admin-token"})) as client:
        assert client.status()["role"] == "master" and client.failures() == []
        assert client.handover(timeout_s=1.0)["new_master"] == "b"
        assert [x["refusal"] for x in client.resubmit(["1-0"], by="x")] == ["missing"]
    assert handed == [1.0]


def request_handover_with(address: str, token: str):
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.AdminStub(ch).Handover(pb.HandoverRequest(timeout_s=1.0), timeout=5,
                                              metadata=[("authorization", f"Bearer {token}")])


def test_a_peer_without_a_read_token_takes_status_with_the_admin_token_alone():
    """A deployment made before the read scope: a read token is unknown there (UNAUTHENTICATED,
    naming the admin token), and the admin token works as before."""
    check = TokenCheck(TOKENS)
    assert check.accepted_not_first == {"ingest": 0, "escalation": 0, "admin": 0}
    server, address = serve(GrpcSecurity(tokens=TOKENS))
    try:
        assert admin_status(address, "admin-token").role == "worker"
        with pytest.raises(grpc.RpcError) as unknown:
            admin_status(address, "read-new")
        assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert unknown.value.details() == ("the bearer token is not valid for admin "
                                           "(send 'authorization: Bearer <token>')")
    finally:
        server.stop(None).wait()
