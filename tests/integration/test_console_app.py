"""The console's application and server without a browser: real HTTP on loopback (and HTTPS
with a test CA's certificate) against the session's redis-server.

What a page shows comes from the flow's Redis as the peers write it: a status written with
``FlowStore.write_status``, streams written with XADD, failed messages audited by a master
that runs the flow (``tests/integration/test_audit_store.py``).
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request

import pytest
import redis
import trustme

from tests.integration.test_audit_store import FLOW, Master, publish, BROKEN, CALLS
from twinflow.cluster.console.access import ConsoleAccess, check_console_bind
from twinflow.cluster.console.app import ConsoleApp
from twinflow.cluster.console.server import ConsoleServer
from twinflow.cluster.console.snapshot import ConsoleView
from twinflow.grpc_security import GrpcSecurity, SecurityConfigError
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.audit import AuditStore
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore

TOKENS = {"read": "r-token", "admin": "a-token", "ingest": "i-token"}


@pytest.fixture(autouse=True)
def service():
    CALLS.clear(), BROKEN.clear()


@pytest.fixture
def graph(flow_name):
    return parse_graph(FLOW.replace("flow: f\n", f"flow: {flow_name}\n"))


def serve(graph, store, security=None, clock=None, handover=None, **server):
    view = ConsoleView(graph, [store], clock=clock or FakeClock(1000.0).now)
    app = ConsoleApp(view, ConsoleAccess(security), handover=handover)
    return ConsoleServer(app, "127.0.0.1:0", security=security, **server)


def call(url: str, path: str, token: str | None = None, body: dict | None = None, action: bool = True,
         context=None) -> tuple[int, dict | str]:
    headers = {"X-Twinflow-Operator": "ops anna"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None and action:
        headers["X-Twinflow-Console"] = "1"
    request = urllib.request.Request(url.rstrip("/") + path.removeprefix("/console"), headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def failed_two(store) -> list[str]:
    BROKEN.update({"o1", "o2"})
    publish(store, {"id": "o1", "type": "order"}, {"id": "o2", "type": "order"}, {"id": "o3", "type": "order"})
    Master(store).run(1.0)
    BROKEN.clear()
    return [e.id for e in AuditStore(store).entries()]


def test_the_snapshot_shows_the_peers_counts_rates_and_failures(graph, store):
    clock = FakeClock(1000.0)
    seconds, micros = store.r.time()
    store.write_status({"flow": graph.name, "peer_id": "peer-a", "role": "master", "epoch": 1,
                        "grpc_address": "127.0.0.1:7001", "suspended": {}, "at": seconds + micros / 1e6,
                        "links": {"check.passed": 7}})
    gone = FlowStore(store.r, store.keys, "peer-b")  # killed as master 10 s ago: its status lingers
    gone.write_status({"peer_id": "peer-b", "role": "master", "epoch": 0, "at": seconds - 10.0,
                       "links": {"check.passed": 99}})
    server = serve(graph, store, clock=clock.now)
    try:
        status, shape = call(server.url, "/console/api/flow")
        assert status == 200 and shape["input"] == graph.input
        assert {n["name"] for n in shape["nodes"]} == set(graph.nodes)
        status, snap = call(server.url, "/console/api/snapshot")
        assert status == 200 and snap["redis"] == "ok" and snap["epoch"] == 1
        assert [(p["peer_id"], p["role"], p["silent"]) for p in snap["peers"]] == [
            ("peer-a", "master", False), ("peer-b", "master", True)]
        assert snap["peers"][0]["grpc_address"] == "127.0.0.1:7001" and snap["peers"][1]["age_s"] >= 10
        assert snap["links"] == {"check.passed": {"count": 7, "rate": 0.0}}  # the live master's alone
        sink = next(name for name in snap["outlinks"] if name.endswith(".done"))
        assert snap["outlinks"][sink] == {"count": 0, "rate": 0.0}

        failed_two(store)  # o3 delivered, o1 and o2 failed
        clock.advance(2.0)
        status, snap = call(server.url, "/console/api/snapshot")
        assert snap["outlinks"][sink]["count"] == 1 and snap["outlinks"][sink]["rate"] == 0.5  # 1 in 2 s
        assert snap["uplink"]["count"] == 3
        assert snap["failures"]["failed"] == 2 and snap["failures"]["entries"] == 2
        store.r.xtrim(store.keys.sink, maxlen=0)  # a trimmed stream still counts what it took
        clock.advance(2.0)
        assert call(server.url, "/console/api/snapshot")[1]["outlinks"][sink]["count"] == 1
    finally:
        server.stop()


def test_failed_messages_are_listed_searched_shown_and_resubmitted_once(graph, store):
    o1, o2 = failed_two(store)
    server = serve(graph, store)
    try:
        status, listed = call(server.url, "/console/api/failures")
        assert status == 200 and [e["audit_id"] for e in listed["entries"]] == [o1, o2]
        assert all("message" not in e for e in listed["entries"])  # bodies only one at a time
        assert [e["audit_id"] for e in call(server.url, "/console/api/failures?id=o2")[1]["entries"]] == [o2]
        assert call(server.url, "/console/api/failures?node=nowhere")[1]["entries"] == []
        assert call(server.url, "/console/api/failures?limit=many")[0] == 400
        assert call(server.url, "/console/api/failures?status=LOST")[0] == 400
        status, shown = call(server.url, f"/console/api/failures/{o1}")
        assert status == 200 and json.loads(shown["message"]) == {"id": "o1", "type": "order"}
        assert call(server.url, "/console/api/failures/1700000000000-0")[0] == 404

        status, done = call(server.url, "/console/api/resubmit", body={"refs": [o1, "1700000000000-0"]})
        assert status == 200 and [(r["audit_id"], r["ok"]) for r in done["results"]] == [
            (o1, True), ("1700000000000-0", False)]
        assert AuditStore(store).entry(o1).mark["by"] == "ops anna (open console)"
        status, again = call(server.url, "/console/api/resubmit", body={"refs": [o1]})
        assert not again["results"][0]["ok"] and "already resubmitted" in again["results"][0]["reason"]
        assert call(server.url, "/console/api/resubmit", body={"refs": "o1"})[0] == 400
    finally:
        server.stop()


def test_a_bad_parameter_is_refused_naming_it(graph, store):
    server = serve(graph, store)
    try:
        for query, named in (("limit=abc", "limit"), ("limit=-3", "limit"), ("status=LOST", "status")):
            status, answer = call(server.url, f"/console/api/failures?{query}")
            assert status == 400 and answer["error"].startswith(named), answer
            assert "invalid literal" not in answer["error"]
    finally:
        server.stop()


def test_a_read_token_looks_an_admin_token_acts_and_anything_else_is_refused(graph, store, caplog):
    o1, _ = failed_two(store)
    security = GrpcSecurity(tokens=TOKENS)
    asked = []
    server = serve(graph, store, security=security, handover=lambda: asked.append(1) or [{"ok": True}])
    try:
        # No token, a wrong one, one of another scope: one answer, which tells nothing about the token.
        refusals = [call(server.url, "/console/api/snapshot", token=t) for t in (None, "wrong", "i-token")]
        assert refusals[0][0] == 401 and refusals == [refusals[0]] * 3, refusals
        assert call(server.url, "/console/api/snapshot", token="r-token")[0] == 200
        status, me = call(server.url, "/console/api/whoami", token="r-token")
        assert me["may_look"] and not me["may_act"] and me["who"].startswith("ops anna (token ")
        assert "r-token" not in me["who"]

        for path, body in (("/console/api/resubmit", {"refs": [o1]}), ("/console/api/handover", {})):
            status, refused = call(server.url, path, token="r-token", body=body)
            assert status == 403 and "admin token" in refused["error"]
            # Without the console's header an admin's action is refused too (another site's page).
            assert call(server.url, path, token="a-token", body=body, action=False)[0] == 403
        assert AuditStore(store).entry(o1).status == "FAILED" and asked == []
        assert any(getattr(r, "event", "") == "console_action" and r.ok is False for r in caplog.records)

        assert call(server.url, "/console/api/handover", token="a-token", body={})[1] == {"results": [{"ok": True}]}
        status, done = call(server.url, "/console/api/resubmit", token="a-token", body={"refs": [o1]})
        assert status == 200 and done["results"][0]["ok"] and asked == [1]
        assert AuditStore(store).entry(o1).status == "RESUBMITTED"
    finally:
        server.stop()


def test_the_page_and_its_files_are_served_with_a_strict_policy(graph, store):
    server = serve(graph, store)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as reply:
            page = reply.read().decode()
            assert "default-src 'self'" in reply.headers["Content-Security-Policy"]
        assert '<script src="/console/static/console.js"' in page
        for name in ("console.js", "console.css"):
            with urllib.request.urlopen(server.url + f"static/{name}", timeout=10) as reply:
                assert reply.status == 200 and len(reply.read()) > 1000
        assert call(server.url, "/console/static/../app.py")[0] == 404
    finally:
        server.stop()


def test_redis_down_is_shown_not_raised(graph, flow_name):
    with socket.socket() as held:  # a port nothing answers on
        held.bind(("127.0.0.1", 0))
        down = FlowStore(redis.Redis(port=held.getsockname()[1], socket_connect_timeout=0.2), FlowKeys(flow_name),
                         "console")
        snap = ConsoleView(graph, [down]).snapshot()
    assert snap["redis"].startswith("Redis did not answer") and snap["peers"] == []


def test_https_with_tokens_and_the_bind_rules(graph, store, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(cert_file)
    cert.private_key_pem.write_to_path(key_file)
    security = GrpcSecurity(tokens=TOKENS)
    server = serve(graph, store, security=security, cert=str(cert_file), key=str(key_file))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context()
        ca.configure_trust(context)
        assert call(server.url, "/console/api/snapshot", token="r-token", context=context)[0] == 200
    finally:
        server.stop()
    # Beyond loopback: TLS and tokens, or nothing is bound.
    with pytest.raises(SecurityConfigError, match="without TLS"):
        check_console_bind("0.0.0.0:8470", security, tls=False)
    with pytest.raises(SecurityConfigError, match="without tokens"):
        check_console_bind("0.0.0.0:8470", GrpcSecurity(), tls=True)
    check_console_bind("0.0.0.0:8470", security, tls=True)
    check_console_bind("0.0.0.0:8470", GrpcSecurity(insecure=True), tls=False)  # the operator said so
