"""The peer's gRPC server over real loopback sockets: Ingest and Admin round trips, their errors,
a real Redis going down under Publish, and each service's own capacity."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent import futures

import grpc
import pytest
import redis

from tests.conftest import wait_until
from twinflow.client import peer_status, publish, request_handover
from twinflow.cluster.escalation import EscalationSender
from twinflow.cluster.escalation_servicer import EscalationServicer
from twinflow.cluster.grpc_server import (
    DEFAULT_INGEST_LIMIT,
    PUBLISH_ANSWER_MARGIN_S,
    PUBLISH_MAX_WAIT_S,
    AdminServicer,
    BindError,
    IngestServicer,
    create_server,
)
from twinflow.testing.servers import redis_answers
from twinflow.testing.services import LocalServices
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc

FLOW = "orders"


class FakeUplink:
    """The publish seam: records bodies and hands out stream-like positions, or fails like a down Redis."""

    def __init__(self):
        self.bodies: list[bytes] = []
        self.deadlines: list[float] = []
        self.down = False

    def __call__(self, bodies: list[bytes], deadline_s: float) -> list[str]:
        self.deadlines.append(deadline_s)
        if self.down:
            raise ConnectionError("redis at 127.0.0.1:6390 refused the connection")
        start = len(self.bodies)
        self.bodies.extend(bodies)
        return [f"1700000000000-{start + i}" for i in range(len(bodies))]


class FakePeer:
    """Status and handover as plain callables, recording what handover was asked."""

    def __init__(self):
        self.handovers: list[float] = []

    def status(self) -> dict:
        return {"flow": FLOW, "peer_id": "node-a", "role": "master", "epoch": 7, "delivered": 42, "not_a_field": 1}

    def handover(self, timeout_s: float) -> dict:
        self.handovers.append(timeout_s)
        return {"ok": True, "new_master": "node-b", "seconds": 0.25}


@pytest.fixture
def peer():
    uplink, fake = FakeUplink(), FakePeer()
    server, port = create_server(
        "127.0.0.1:0",
        ingest=IngestServicer(FLOW, uplink, max_batch=3),
        admin=AdminServicer(fake.status, fake.handover),
    )
    yield f"127.0.0.1:{port}", uplink, fake
    server.stop(None).wait()


def test_publish_round_trip(peer):
    address, uplink, _ = peer
    bodies = [b'{"id": "m1", "key": 1}', b'{"id": "m2", "key": 2}']

    assert publish(address, FLOW, bodies) == ["1700000000000-0", "1700000000000-1"]
    assert uplink.bodies == bodies
    assert publish(address, FLOW, []) == []


@pytest.mark.parametrize(
    "flow, count, detail",
    [("payments", 1, "wrong flow 'payments'"), (FLOW, 4, "at most 3")],
)
def test_publish_refuses_bad_requests_before_writing(peer, flow, count, detail):
    address, uplink, _ = peer

    with pytest.raises(grpc.RpcError) as refused:
        publish(address, flow, [b"{}"] * count)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in refused.value.details()
    assert uplink.bodies == []


def test_publish_while_the_uplink_is_down_is_unavailable(peer):
    address, uplink, _ = peer
    uplink.down = True

    with pytest.raises(grpc.RpcError) as refused:
        publish(address, FLOW, [b"{}"])

    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "refused the connection" in refused.value.details()
    assert f"uplink of flow {FLOW!r} unavailable" in refused.value.details()


def test_publish_gives_the_uplink_the_rpc_remaining_time_less_a_margin_capped(peer):
    address, uplink, _ = peer

    publish(address, FLOW, [b"{}"], timeout_s=2.0)
    with grpc.insecure_channel(address) as channel:  # no client deadline at all: the cap
        pb_grpc.IngestStub(channel).Publish(pb.PublishRequest(flow=FLOW, messages=[pb.Envelope(body=b"{}")]))
    publish(address, FLOW, [b"{}"], timeout_s=600.0)  # a long client deadline: the cap too

    short, unbounded, long = uplink.deadlines
    # The RPC spent a little of its 2 s on the way in (never half a second here); gRPC's
    # timeout header rounds up, so the server may see a few milliseconds more than 2 s.
    assert 2.0 - PUBLISH_ANSWER_MARGIN_S - 0.5 < short <= 2.0 - PUBLISH_ANSWER_MARGIN_S + 0.05
    assert unbounded == long == PUBLISH_MAX_WAIT_S


def test_status_round_trip_fills_defaults(peer):
    address, _, _ = peer

    status = peer_status(address)

    assert status["role"] == "master" and status["epoch"] == 7 and status["delivered"] == 42
    assert status["baked"] == 0 and status["grpc_address"] == ""
    assert set(status) == set(pb.NodeStatus.DESCRIPTOR.fields_by_name)


def test_handover_round_trip(peer):
    address, _, fake = peer

    reply = request_handover(address, timeout_s=2.5)

    assert reply == {"ok": True, "new_master": "node-b", "seconds": 0.25, "reason": ""}
    with grpc.insecure_channel(address) as channel:  # a request without a timeout gets the default
        pb_grpc.AdminStub(channel).Handover(pb.HandoverRequest(), timeout=5.0)

    assert fake.handovers == [2.5, AdminServicer.DEFAULT_HANDOVER_TIMEOUT_S]


def test_bind_to_a_taken_port_fails_clearly(peer):
    address, _, _ = peer

    with pytest.raises(BindError, match=re.escape(address)):
        create_server(address)


@pytest.fixture
def dedicated_services():
    """A Redis (and ZooKeeper) of this test's own: the test stops the Redis."""
    svc = LocalServices.start()
    yield svc
    svc.stop()


def test_publish_while_a_real_redis_is_stopped_answers_unavailable_before_the_deadline(dedicated_services):
    svc = dedicated_services
    client = redis.Redis.from_url(svc.redis_url, socket_connect_timeout=0.5, socket_timeout=0.5)
    store = FlowStore(client, FlowKeys(FLOW), "node-a")
    server, port = create_server("127.0.0.1:0", ingest=IngestServicer(FLOW, store.publish))
    address = f"127.0.0.1:{port}"
    try:
        assert len(publish(address, FLOW, [b'{"id": "m1"}'])) == 1  # while Redis is up: written
        os.kill(svc.redis.pid, signal.SIGTERM)
        wait_until(lambda: not redis_answers(svc.redis.port), 10.0, what="redis stopped")

        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            publish(address, FLOW, [b"{}"], timeout_s=2.0)
        elapsed = time.monotonic() - began

        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert f"uplink of flow {FLOW!r} unavailable" in refused.value.details()
        assert f"127.0.0.1:{svc.redis.port}" in refused.value.details()  # which Redis did not answer
        # The store kept retrying for the RPC's time less the margin, then answered before the deadline.
        assert 2.0 - PUBLISH_ANSWER_MARGIN_S - 0.05 <= elapsed < 2.0 + 0.1
    finally:
        store.close()  # ends a publish still retrying, before its deadline
        server.stop(None).wait()
        client.close()


class BlockingUplink:
    """A publish that hangs (as on a Redis that does not answer) until ``release`` is set."""

    def __init__(self):
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.inside = 0

    def __call__(self, bodies: list[bytes], deadline_s: float | None = None) -> list[str]:
        with self.cond:
            self.inside += 1
            self.cond.notify_all()
        try:
            assert self.release.wait(60.0), "the test never released the hung publishes"
            return ["1700000000000-0"] * len(bodies)
        finally:
            with self.cond:
                self.inside -= 1


def test_hung_publishes_starve_neither_escalation_nor_admin():
    uplink, fake, claimed = BlockingUplink(), FakePeer(), []

    def on_claims(epoch, claims):
        claimed.extend(claims)
        return len(claims)

    server, port = create_server(
        "127.0.0.1:0",
        escalation=EscalationServicer(FLOW, on_claims),
        ingest=IngestServicer(FLOW, uplink),
        admin=AdminServicer(fake.status, fake.handover),
    )
    address = f"127.0.0.1:{port}"
    clients = futures.ThreadPoolExecutor(DEFAULT_INGEST_LIMIT)
    sender = None
    try:
        hung = [clients.submit(publish, address, FLOW, [b"{}"], 30.0) for _ in range(DEFAULT_INGEST_LIMIT)]
        wait_until(lambda: uplink.inside == DEFAULT_INGEST_LIMIT, 10.0, what="the ingest limit saturated")

        sender = EscalationSender(FLOW, "node-a", lambda: 7, lambda: {"node-b": address})
        sender.send([("m1", "1700000000000", "1700000000000-0", "all")])
        assert sender.flush(5.0), sender.stats()
        assert claimed == [("m1", "1700000000000", "1700000000000-0", "all")]

        assert peer_status(address, timeout_s=2.0)["role"] == "master"

        began = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            publish(address, FLOW, [b"{}"], timeout_s=5.0)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
        assert refused.value.details() == f"{DEFAULT_INGEST_LIMIT} publishes in progress; retry"
        assert time.monotonic() - began < 1.0  # at once, not queued behind the hung ones
        assert uplink.inside == DEFAULT_INGEST_LIMIT  # the refused publish never reached the uplink
    finally:
        uplink.release.set()
        if sender is not None:
            sender.stop()
        clients.shutdown(wait=True)
    try:
        # Released, the hung publishes answer and give their slots back.
        assert [f.result() for f in hung] == [["1700000000000-0"]] * DEFAULT_INGEST_LIMIT
        assert publish(address, FLOW, [b"{}"], timeout_s=5.0) == ["1700000000000-0"]
    finally:
        server.stop(None).wait()


def _escalate_once(address: str) -> list:
    """One raw Escalate stream carrying one batch; its acks."""
    batch = pb.EscalationBatch(flow=FLOW, from_node="node-c", epoch=7, seq=1)
    batch.claims.add(id="m9", key="1700000000009", position="1700000000009-0")
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.EscalationStub(channel).Escalate(iter([batch]), timeout=5.0))


def test_admin_and_escalation_limits_refuse_the_call_beyond_them_at_once():
    entered, release, fake = threading.Event(), threading.Event(), FakePeer()

    def slow_handover(timeout_s):
        entered.set()
        assert release.wait(30.0), "the test never released the handover"
        return fake.handover(timeout_s)

    server, port = create_server(
        "127.0.0.1:0",
        escalation=EscalationServicer(FLOW, lambda epoch, claims: len(claims)),
        admin=AdminServicer(fake.status, slow_handover),
        admin_limit=1,
        escalation_streams=1,
    )
    address = f"127.0.0.1:{port}"
    clients = futures.ThreadPoolExecutor(1)
    sender = EscalationSender(FLOW, "node-a", lambda: 7, lambda: {"node-b": address})
    try:
        handover = clients.submit(request_handover, address, 2.0)
        assert entered.wait(5.0), "the handover never reached the peer"
        with pytest.raises(grpc.RpcError) as refused:
            peer_status(address)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details() == "1 admin calls in progress; retry"

        sender.send([("m1", "1700000000000", "1700000000000-0", "all")])
        assert sender.flush(5.0), sender.stats()  # the one stream allowed is the sender's
        with pytest.raises(grpc.RpcError) as refused:
            _escalate_once(address)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details() == "1 escalation streams open; retry"
    finally:
        release.set()
        sender.stop()
        clients.shutdown(wait=True)
    try:
        # Finished calls and closed streams give their slots back.
        assert handover.result()["ok"] is True
        assert peer_status(address)["role"] == "master"
        acks = wait_until(lambda: _try(_escalate_once, address), 5.0, what="the stream's slot given back")
        assert [(a.seq, a.accepted, a.claimed) for a in acks] == [(1, True, 1)]
    finally:
        server.stop(None).wait()


def _try(call, *args):
    """``call(*args)``, or None if it failed with RESOURCE_EXHAUSTED (so a poll tries again)."""
    try:
        return call(*args)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return None
