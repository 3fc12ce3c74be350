"""A secured deployment end to end: two real peers with every protection on, through a master kill.

gRPC between the peers and to clients runs over TLS with client
certificates (mutual) and a token per scope, all named in the flow file's
``security`` section; Redis asks for a password, given to the peers through
``TWINFLOW_REDIS_PASSWORD`` (not on their command line); ZooKeeper keeps the
flow's znodes behind digest credentials from ``TWINFLOW_ZK_AUTH``. A client
publishes with the ingest token; the master's escalations reach the worker
(so the worker's claims count them); a client without the token or without a
certificate gets nowhere; the master is killed and the other peer delivers
the rest, each message exactly once; ``twinflow status`` reads the peers with
the same settings.

An operator is not a peer: with a certificate of its own, signed by the
cluster's CA (never a peer's key), and a flow file without the peers'
``security`` section, ``twinflow status`` reads the peers over gRPC (Redis not
answering at the URL given) and ``twinflow handover`` reaches the master, the
settings given as flags or as ``TWINFLOW_*`` variables; without a client
certificate each says in one line what to pass. With the read token alone (the
peers have one besides the three they need), ``twinflow status`` and
``twinflow failures list`` read the peer, and a resubmit sent with it is
refused (``PERMISSION_DENIED``). One peer serves the operator console over HTTPS with the
peers' certificate and tokens, its metrics on the same port.
"""

import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from types import SimpleNamespace

import grpc
import pytest
import trustme

from tests.cluster.harness import cluster_on
from tests.conftest import wait_until
from tests.integration.test_console_server import many_files, open_idle  # noqa: F401 (many_files: a fixture)
from twinflow.client import Client
from twinflow.testing.servers import free_port
from twinflow.testing.services import LocalRedis
from twinflow.grpc_security import GrpcSecurity, TlsFiles

pytestmark = pytest.mark.cluster

FLOW = """\
flow: secure
uplink: {stream: uplink, batch_size: 500}
message: {id: id, id_ttl: 86400}
input: deliver
nodes:
  deliver: {type: action, sink: {stream: sink}}
  sort: {type: sort, pairs_with: deliver, key: seq, key_type: int, bake_time: 30}
cluster: {session_timeout: 2.0}
security:
  tls: {cert: node.pem, key: node-key.pem, ca: ca.pem, mutual: true}
  tokens: {ingest: file:ingest.token, escalation: file:escalation.token, admin: "env:TF_TEST_ADMIN_TOKEN",
           read: file:read.token}
"""


@pytest.fixture
def secured(tmp_path, services, flow_name, monkeypatch):
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1", "localhost")  # both peers dial each other on loopback
    cert.private_key_pem.write_to_path(str(tmp_path / "node-key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "node.pem"))
    operator = ca.issue_cert("operator.example")  # a client certificate of the operator's own
    operator.private_key_pem.write_to_path(str(tmp_path / "operator-key.pem"))
    operator.cert_chain_pems[0].write_to_path(str(tmp_path / "operator.pem"))
    for scope in ("ingest", "escalation", "read"):
        (tmp_path / f"{scope}.token").write_text(f"{scope}-{flow_name}\n")
    (tmp_path / "redis.pw").write_text("redis-pw-of-the-test\n")
    monkeypatch.setenv("TF_TEST_ADMIN_TOKEN", f"admin-{flow_name}")
    monkeypatch.setenv("TWINFLOW_REDIS_PASSWORD", f"file:{tmp_path / 'redis.pw'}")
    (tmp_path / "zk.auth").write_text("flowuser:zk-pw-of-the-test\n")
    monkeypatch.setenv("TWINFLOW_ZK_AUTH", f"file:{tmp_path / 'zk.auth'}")
    redis_server = LocalRedis.start(str(tmp_path / "redis"), password="redis-pw-of-the-test")
    # The harness reads statuses and the sink with the password in its own URL.
    local = SimpleNamespace(redis_url=redis_server.url.replace("redis://", "redis://:redis-pw-of-the-test@"),
                            zk_hosts=services.zk_hosts)
    cluster = cluster_on(local, tmp_path, flow_name, text=FLOW)
    cluster.console_port = free_port()  # peer b serves the console, its metrics beside it
    try:
        for peer_id in ("a", "b"):
            # No password on the command line. A worker that reads at once (not behind) has read
            # what the master escalates, so claims travel the secured escalation stream.
            console = ["--console-listen", f"127.0.0.1:{cluster.console_port}", "--metrics-listen",
                       "127.0.0.1:0"] if peer_id == "b" else []
            cluster.peer(peer_id, redis_url=redis_server.url, extra=["--worker-read-behind-ms", "0", *console])
        yield cluster, tmp_path
    finally:
        cluster.stop()
        redis_server.stop()


def test_a_secured_pair_fails_over_with_nothing_lost(many_files, secured, flow_name):
    cluster, d = secured
    cluster.wait_status("a", streaming=1)
    cluster.wait_status("b", streaming=1)
    master = wait_until(lambda: next((n for n in "ab" if cluster.status(n).get("role") == "master"), None), 60,
                        what="a master")
    worker = "b" if master == "a" else "a"
    address = {n: cluster.status(n)["grpc_address"] for n in "ab"}
    tls = TlsFiles(cert=str(d / "node.pem"), key=str(d / "node-key.pem"), ca=str(d / "ca.pem"))
    ingest = GrpcSecurity(tls=tls, tokens={"ingest": f"ingest-{flow_name}"})

    docs = [{"id": f"m{i:05d}", "seq": i} for i in range(2000)]
    with Client(address[master], flow_name, ingest) as client:
        client.publish(docs[:1000])
    cluster.sent.extend(d["id"] for d in docs)
    # The worker takes escalations only through the escalation stream: TLS, its client
    # certificate and the escalation token all had to work for this count to move. (Its claims
    # may not: what it reads after the master processed it, it skips, unbaked; and the master
    # escalates only what the worker has read.)
    wait_until(lambda: int(cluster.status(worker).get("escalations_taken", 0)) > 0
               and int(cluster.status(worker).get("uplink_lag", -1)) == 0, 60, what="the worker's escalations")

    # Peer b's console: HTTPS with the peers' certificate, the peers' tokens, the metrics beside it.
    https = ssl.create_default_context(cafile=str(d / "ca.pem"))
    console = f"https://127.0.0.1:{cluster.console_port}"

    def get(path: str, token: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(console + path, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10, context=https) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    status, body = get("/console/api/snapshot", f"read-{flow_name}")
    assert status == 200 and {p["peer_id"] for p in json.loads(body)["peers"]} == {"a", "b"}
    assert get("/console/api/snapshot") == get("/console/api/snapshot", f"ingest-{flow_name}")  # one refusal
    assert get("/console/api/snapshot")[0] == 401
    status, metrics = get("/metrics")
    assert status == 200 and b"twinflow_role" in metrics
    # A thousand connections that send nothing hold no thread of the peer: its metrics and the
    # console answer meanwhile (many_files: room in this process for the client sockets).
    idle = open_idle(cluster.console_port)
    try:
        assert get("/metrics")[0] == 200 and get("/console/api/snapshot", f"read-{flow_name}")[0] == 200
    finally:
        for sock in idle:
            sock.close()

    with pytest.raises(grpc.RpcError) as no_token:
        Client(address[master], flow_name, GrpcSecurity(tls=tls), retry_unavailable=False).publish(docs[:1])
    assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    no_cert = GrpcSecurity(tls=TlsFiles(ca=str(d / "ca.pem")), tokens={"ingest": f"ingest-{flow_name}"})
    with pytest.raises(grpc.RpcError) as refused:
        Client(address[master], flow_name, no_cert, retry_unavailable=False).publish(docs[:1], deadline_s=3)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    cluster.peers[master].kill()
    # The survivor takes the rest, sent by `twinflow publish` as a service's script would, with a
    # client certificate of its own and the ingest token (the dead peer first: it moves on).
    flow = d / "operator.yaml"  # the flow file without the peers' security section
    flow.write_text(cluster.flow_path.read_text().split("\nsecurity:")[0] + "\n")
    published = subprocess.run(
        [sys.executable, "-m", "twinflow.cli", "publish", str(flow), "--peer", address[master], "--peer",
         address[worker], "--deadline", "60", "--tls-cert", str(d / "operator.pem"), "--tls-key",
         str(d / "operator-key.pem"), "--tls-ca", str(d / "ca.pem"), "--token", f"ingest=file:{d / 'ingest.token'}"],
        input="".join(json.dumps(doc) + "\n" for doc in docs[1000:]), capture_output=True, text=True, timeout=90)
    assert published.returncode == 0, published.stderr[-2000:]
    assert len(published.stdout.split()) == 1000 and "1000 messages written" in published.stderr
    report = cluster.wait_delivered(timeout_s=90)
    assert report.exactly_once, report
    cluster.wait_status(worker, timeout_s=10, role="master")  # its status hash is rewritten every 0.33-0.5 s

    done = subprocess.run([sys.executable, "-m", "twinflow.cli", "status", str(cluster.flow_path), "--json",
                           "--redis", cluster.peers[worker].redis_url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {r["peer_id"]: r for r in json.loads(done.stdout)["peers"]}
    assert rows[worker]["role"] == "master"

    # The killed master's status has expired (handover asks every master Redis names).
    wait_until(lambda: [n for n, r in cluster.statuses().items() if r.get("role") == "master"] == [worker], 30,
               what="the killed master's status to expire")
    operator = operator_calls(cluster, d, address[worker], cluster.peers[worker].redis_url)
    for how in ("flags", "variables"):
        code, out, err = operator[f"status, {how}"]
        assert code == 0, err
        (row,) = json.loads(out)["peers"]  # from the peer itself: Redis did not answer
        assert (row["peer_id"], row["role"]) == (worker, "master"), row
        code, out, err = operator[f"handover, {how}"]
        assert code == 1 and json.loads(out)["reason"] == "no other peer is waiting to take over", (out, err)
    for command in ("status", "handover"):
        code, out, err = operator[f"{command}, no certificate"]
        assert code == 3, (out, err)
        assert (f"twinflow: peer at {address[worker]} did not answer: UNAVAILABLE: " in err
                and "client without a certificate: pass --tls-cert and --tls-key" in err), err
        assert "Traceback" not in err and "Handshake failed" not in err  # one line, not the gRPC core's
    # The read token looks (status and the audit over gRPC) and may not act.
    code, out, err = operator["status, read"]
    assert code == 0 and json.loads(out)["peers"][0]["peer_id"] == worker, (out, err)
    code, out, err = operator["failures list, read"]
    assert code == 0 and json.loads(out) == {"flow": flow_name, "entries": []}, (out, err)
    code, out, err = operator["failures resubmit, read as admin"]
    assert code == 3 and "PERMISSION_DENIED: this token may not call twinflow.wire.Admin/Resubmit" in err, (out, err)
    outputs = "".join(out + err for _, out, err in operator.values())
    assert "redis-pw-of-the-test" not in done.stdout + done.stderr + outputs + cluster.logs()
    assert f"admin-{flow_name}" not in outputs and f"read-{flow_name}" not in outputs + cluster.logs()


def operator_calls(cluster, d, address: str, redis_url: str) -> dict:
    """``twinflow status`` (over gRPC) and ``handover`` as an operator: the settings as flags, as
    variables, and without a client certificate; then status, ``failures list`` and a resubmit with
    the read token. Each (code, out, err)."""
    flow = d / "operator.yaml"  # the flow file without the peers' security section
    flow.write_text(cluster.flow_path.read_text().split("\nsecurity:")[0] + "\n")
    flags = ["--tls-cert", str(d / "operator.pem"), "--tls-key", str(d / "operator-key.pem"),
             "--tls-ca", str(d / "ca.pem"), "--token", "admin=env:TF_TEST_ADMIN_TOKEN"]
    variables = {"TWINFLOW_TLS_CERT": str(d / "operator.pem"), "TWINFLOW_TLS_KEY": str(d / "operator-key.pem"),
                 "TWINFLOW_TLS_CA": str(d / "ca.pem"), "TWINFLOW_TOKEN": "admin=env:TF_TEST_ADMIN_TOKEN"}
    no_cert = ["--tls-ca", str(d / "ca.pem"), "--token", "admin=env:TF_TEST_ADMIN_TOKEN"]
    tls = flags[:6]
    read = tls + ["--token", f"read=file:{d / 'read.token'}"]
    # Nothing listens at this Redis URL, so status asks the peer over gRPC.
    status = ["status", str(flow), "--json", "--redis", f"redis://127.0.0.1:{free_port()}/0", "--peer", address]
    handover = ["handover", str(flow), "--redis", redis_url, "--timeout", "2"]
    calls = {"status, flags": (status + flags, {}), "status, variables": (status, variables),
             "status, no certificate": (status + no_cert, {}), "handover, flags": (handover + flags, {}),
             "handover, variables": (handover, variables), "handover, no certificate": (handover + no_cert, {})}
    with_read = {"status, read": (status + read, {}),
                 "failures list, read": (["failures", "list", str(flow), "--json", "--peer", address] + read, {}),
                 "failures resubmit, read as admin": (["failures", "resubmit", str(flow), "--all", "--peer", address]
                                                      + tls + ["--token", f"admin=file:{d / 'read.token'}"], {})}
    # Two waves: a peer runs 4 Admin calls at once and refuses a fifth (RESOURCE_EXHAUSTED).
    return {**run_at_once(calls, d), **run_at_once(with_read, d)}


def run_at_once(calls: dict, d) -> dict:
    """Each ``name: (argv, env)`` of ``calls`` as a ``twinflow`` process, all at once: name -> (code, out, err)."""
    running = {name: subprocess.Popen([sys.executable, "-m", "twinflow.cli", *argv], cwd=d, text=True,
                                      env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for name, (argv, env) in calls.items()}
    done = {name: proc.communicate(timeout=60) for name, proc in running.items()}
    return {name: (running[name].returncode, *out_err) for name, out_err in done.items()}
