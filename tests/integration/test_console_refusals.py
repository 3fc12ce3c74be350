"""What the console answers when Redis, or what Redis holds, is not as it should be: Redis down
or silent (a prompt 503, never a five-minute wait), a malformed value written by hand (shown
as malformed where it is, the rest whole); and the warning of a console served with
``--insecure``.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import time

import pytest

from tests.conftest import wait_until
from tests.integration.test_audit_store import BROKEN, CALLS
from tests.integration.test_console_app import call, failed_two, graph, serve  # noqa: F401 (graph: a fixture)
from twinflow.cluster.console import insecure
from twinflow.cluster.console.access import ConsoleAccess
from twinflow.cluster.console.app import ConsoleApp
from twinflow.cluster.console.server import ConsoleServer
from twinflow.cluster.console.snapshot import REDIS_DEADLINE_S, ConsoleView, console_stores
from twinflow.grpc_security import GrpcSecurity
from twinflow.runtime.store.audit import AuditStore
from twinflow.runtime.store.flow_store import FlowStore

PROMPT_S = 3 * REDIS_DEADLINE_S + 2  # a call's deadline, a retry's pause and the HTTP round trip, with room


@pytest.fixture(autouse=True)
def service():
    CALLS.clear(), BROKEN.clear()


@pytest.fixture(params=["refused", "silent"])
def dead_redis(request):
    """A Redis URL where nothing answers: a port nobody listens on, or a socket that takes the
    connection and never says a word (the kernel completes it; nobody reads)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        if request.param == "silent":
            held.listen(64)
        yield f"redis://127.0.0.1:{held.getsockname()[1]}/0"


def test_with_redis_down_every_api_answers_503_within_seconds(graph, dead_redis):
    started = time.monotonic()
    stores = console_stores(graph, dead_redis, who="console")
    app = ConsoleApp(ConsoleView(graph, stores), ConsoleAccess(None))
    server = ConsoleServer(app, "127.0.0.1:0")
    try:
        for path, body in (("/console/api/failures", None), ("/console/api/failures/1700000000000-0", None),
                           ("/console/api/resubmit", {"refs": ["1700000000000-0", "1700000000001-0"]})):
            asked = time.monotonic()
            status, answer = call(server.url, path, body=body)
            took = time.monotonic() - asked
            assert status == 503 and answer["error"].startswith("Redis did not answer"), (path, answer)
            assert took < PROMPT_S, f"{path} took {took:.1f} s"
        assert [r["ok"] for r in answer["results"]] == [False, False]  # the resubmit says what it did not do
        asked = time.monotonic()
        status, snap = call(server.url, "/console/api/snapshot")
        assert status == 200 and snap["redis"].startswith("Redis did not answer")
        assert time.monotonic() - asked < PROMPT_S
    finally:
        server.stop()
    assert time.monotonic() - started < 6 * PROMPT_S


def test_one_malformed_value_is_shown_as_malformed_and_the_rest_of_the_snapshot_answers(graph, store):
    o1, o2 = failed_two(store)
    seconds, _ = store.r.time()
    store.write_status({"peer_id": "peer-a", "role": "master", "epoch": 1, "at": seconds, "links": {"check.passed": 3}})
    bad = FlowStore(store.r, store.keys, "peer-bad")
    bad.write_status({"peer_id": "peer-bad", "role": "worker", "epoch": 1, "at": seconds})
    store.r.hset(store.keys.peer("peer-bad"), mapping={"pending_nodes": "{not json", "links": '{"check.passed": "x"}'})
    store.r.hset(store.keys.suspended, mapping={"deliver": "{not json either",
                                                "check": json.dumps({"id": "s1", "reason": "down", "since": 1.0})})
    store.r.hset(store.keys.audit_marks, o2, "not a mark")
    server = serve(graph, store)
    try:
        status, snap = call(server.url, "/console/api/snapshot")
        assert status == 200 and snap["redis"] == "ok"
        peers = {p["peer_id"]: p for p in snap["peers"]}
        assert set(peers) == {"peer-a", "peer-bad"}
        assert sorted(peers["peer-bad"]["malformed"]) == ["links", "pending_nodes"]
        assert "malformed" not in peers["peer-a"] and snap["links"]["check.passed"]["count"] == 3
        assert snap["suspended"]["deliver"] == {"malformed": "{not json either"}
        assert snap["suspended"]["check"]["reason"] == "down"
        assert snap["failures"]["entries"] == 2

        # A malformed audit mark: listed and shown as such, not a 400 as if the filter were bad.
        status, listed = call(server.url, "/console/api/failures?status=ANY")
        assert status == 200 and [(e["audit_id"], e["status"]) for e in listed["entries"]] == [
            (o1, "FAILED"), (o2, "MALFORMED")]
        assert [e["audit_id"] for e in call(server.url, "/console/api/failures")[1]["entries"]] == [o1]
        status, shown = call(server.url, f"/console/api/failures/{o2}")
        assert status == 200 and shown["mark"] == {"status": "MALFORMED", "malformed": "not a mark"}
        status, done = call(server.url, "/console/api/resubmit", body={"refs": [o2]})
        assert status == 200 and not done["results"][0]["ok"] and "MALFORMED" in done["results"][0]["reason"]
        assert AuditStore(store).entry(o2).mark == {"status": "MALFORMED", "malformed": "not a mark"}
    finally:
        server.stop()


def test_a_part_spoiled_whole_is_named_and_the_others_answer(graph, store):
    # A count that is not a number spoils the audit's counts: its panel says so, the peers stay.
    seconds, _ = store.r.time()
    store.write_status({"peer_id": "peer-a", "role": "master", "epoch": 1, "at": seconds})
    store.r.hset(store.keys.audit_counts, "removed", "many")
    snap = ConsoleView(graph, [store]).snapshot()
    assert snap["redis"] == "ok" and [p["peer_id"] for p in snap["peers"]] == ["peer-a"]
    assert snap["failures"] == {} and "malformed" in snap["problems"]["failures"]


def test_an_insecure_console_warns_at_start_and_every_minute(graph, store, caplog, monkeypatch):
    assert insecure.insecure_reason("0.0.0.0:8470", GrpcSecurity(insecure=True), tls=False)
    assert insecure.insecure_reason("0.0.0.0:8470", GrpcSecurity(insecure=True, tokens={"read": "r"}), tls=True) is None
    assert insecure.insecure_reason("127.0.0.1:8470", GrpcSecurity(insecure=True), tls=False) is None
    # Tests bind loopback only: the console is made to take 127.0.0.1 for an address off it.
    monkeypatch.setattr(insecure, "is_loopback", lambda address: False)
    ticks: queue.Queue = queue.Queue()
    waited = []

    def timer(seconds: float) -> bool:  # each minute passes when the test says so
        waited.append(seconds)
        return ticks.get(timeout=30)

    caplog.set_level(logging.WARNING, logger="twinflow.console")

    def warnings() -> int:
        return sum("--insecure: the console on 127.0.0.1" in r.getMessage() for r in caplog.records)

    server = serve(graph, store, security=GrpcSecurity(insecure=True), insecure_wait=timer)
    try:
        wait_until(lambda: warnings() == 1, 5, what="the warning at start")
        ticks.put(False)  # a minute
        wait_until(lambda: warnings() == 2, 5, what="the warning a minute later")
        assert waited[0] == 60.0
        assert all("without TLS and tokens" in r.getMessage() for r in caplog.records if "--insecure" in r.getMessage())
    finally:
        ticks.put(True)  # stopped
        server.stop()
