"""The node's gRPC server over real loopback sockets: Ingest and Admin round trips and their errors."""

from __future__ import annotations

import re

import grpc
import pytest

from twinflow.cluster.grpc_server import (
    AdminServicer,
    BindError,
    IngestServicer,
    create_server,
    node_status,
    publish,
    request_handover,
)
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc

FLOW = "orders"


class FakeUplink:
    """The publish seam: records bodies and hands out stream-like positions, or fails like a down Redis."""

    def __init__(self):
        self.bodies: list[bytes] = []
        self.down = False

    def __call__(self, bodies: list[bytes]) -> list[str]:
        if self.down:
            raise ConnectionError("redis at 127.0.0.1:6390 refused the connection")
        start = len(self.bodies)
        self.bodies.extend(bodies)
        return [f"1700000000000-{start + i}" for i in range(len(bodies))]


class FakeNode:
    """Status and handover as plain callables, recording what handover was asked."""

    def __init__(self):
        self.handovers: list[float] = []

    def status(self) -> dict:
        return {"flow": FLOW, "node_id": "node-a", "role": "master", "epoch": 7, "delivered": 42, "not_a_field": 1}

    def handover(self, timeout_s: float) -> dict:
        self.handovers.append(timeout_s)
        return {"ok": True, "new_master": "node-b", "seconds": 0.25}


@pytest.fixture
def node():
    uplink, fake = FakeUplink(), FakeNode()
    server, port = create_server(
        "127.0.0.1:0",
        ingest=IngestServicer(FLOW, uplink, max_batch=3),
        admin=AdminServicer(fake.status, fake.handover),
    )
    yield f"127.0.0.1:{port}", uplink, fake
    server.stop(None).wait()


def test_publish_round_trip(node):
    address, uplink, _ = node
    bodies = [b'{"id": "m1", "key": 1}', b'{"id": "m2", "key": 2}']

    assert publish(address, FLOW, bodies) == ["1700000000000-0", "1700000000000-1"]
    assert uplink.bodies == bodies
    assert publish(address, FLOW, []) == []


@pytest.mark.parametrize(
    "flow, count, detail",
    [("payments", 1, "wrong flow 'payments'"), (FLOW, 4, "at most 3")],
)
def test_publish_refuses_bad_requests_before_writing(node, flow, count, detail):
    address, uplink, _ = node

    with pytest.raises(grpc.RpcError) as refused:
        publish(address, flow, [b"{}"] * count)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in refused.value.details()
    assert uplink.bodies == []


def test_publish_while_the_uplink_is_down_is_unavailable(node):
    address, uplink, _ = node
    uplink.down = True

    with pytest.raises(grpc.RpcError) as refused:
        publish(address, FLOW, [b"{}"])

    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "refused the connection" in refused.value.details()


def test_status_round_trip_fills_defaults(node):
    address, _, _ = node

    status = node_status(address)

    assert status["role"] == "master" and status["epoch"] == 7 and status["delivered"] == 42
    assert status["baked"] == 0 and status["grpc_address"] == ""
    assert set(status) == set(pb.NodeStatus.DESCRIPTOR.fields_by_name)


def test_handover_round_trip(node):
    address, _, fake = node

    reply = request_handover(address, timeout_s=2.5)

    assert reply == {"ok": True, "new_master": "node-b", "seconds": 0.25, "reason": ""}
    with grpc.insecure_channel(address) as channel:  # a request without a timeout gets the default
        pb_grpc.AdminStub(channel).Handover(pb.HandoverRequest(), timeout=5.0)

    assert fake.handovers == [2.5, AdminServicer.DEFAULT_HANDOVER_TIMEOUT_S]


def test_bind_to_a_taken_port_fails_clearly(node):
    address, _, _ = node

    with pytest.raises(BindError, match=re.escape(address)):
        create_server(address)
