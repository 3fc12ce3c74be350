"""examples/external_service.py against a real Redis and a real Ingest server: its messages reach
the uplink through the client, and it waits for them in the sink until they arrive or its deadline.

No flow runs here: the test plays the flow's action itself, writing each order and payment pair
to the sink as one joined entry, as the chained flow does (docs/reference/redis-keys.md)."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest
import redis

from twinflow.cluster.grpc_server import IngestServicer, create_server
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "external_service.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("external_service", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def ingest(r, flow_name):
    """A peer's Ingest service writing into the flow's uplink in the real Redis."""
    store = FlowStore(r, FlowKeys(flow_name), "node-a")
    server, port = create_server("127.0.0.1:0", ingest=IngestServicer(flow_name, store.publish))
    yield f"127.0.0.1:{port}"
    server.stop(None).wait()
    store.close()


def test_orders_and_payments_come_in_pairs_with_fresh_ids(example):
    docs = example.orders_and_payments(3, "run1", first_seq=100)

    assert [d["type"] for d in docs] == ["order", "payment"] * 3
    assert [d["seq"] for d in docs] == list(range(100, 106))
    assert all(docs[i]["order_id"] == docs[i + 1]["order_id"] for i in range(0, 6, 2))
    assert len({d["id"] for d in docs}) == 6 and all("run1" in d["id"] for d in docs)
    assert example.orders_and_payments(1, "run2", 0)[0]["id"] != docs[0]["id"]


def test_delivered_ids_split_joined_groups(example):
    entries = [(b"1-0", {b"id": b"a-o0+a-p0"}), (b"2-0", {b"id": b"b"})]
    assert example.delivered_ids(entries) == {"a-o0", "a-p0", "b"}


class JoiningAction(threading.Thread):
    """Plays the chained flow: reads the uplink and writes each order with its payment to the sink."""

    def __init__(self, redis_url: str, flow: str):
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(redis_url)
        self.keys = FlowKeys(flow)
        self.stop = threading.Event()

    def run(self):
        after, open_orders = "0-0", {}
        while not self.stop.is_set():
            for _, entries in self.r.xread({self.keys.uplink: after}, block=100) or []:
                for entry_id, fields in entries:
                    after = entry_id
                    doc = json.loads(fields[b"data"])
                    first = open_orders.pop(doc["order_id"], None)
                    if first is None:
                        open_orders[doc["order_id"]] = doc["id"]
                    else:
                        self.r.xadd(self.keys.sink, {"id": f"{first}+{doc['id']}", "data": b"{}"})
        self.r.close()


def test_the_example_publishes_through_the_client_and_finds_its_messages_in_the_sink(
        example, ingest, r, redis_url, flow_name, capsys):
    r.xadd(FlowKeys(flow_name).sink, {"id": "an-earlier-run", "data": b"{}"})  # not counted
    action = JoiningAction(redis_url, flow_name)
    action.start()
    try:
        code = example.main(["--flow", flow_name, "--pairs", "5", "--peer", ingest, "--redis", redis_url,
                             "--deadline", "10"])
    finally:
        action.stop.set()
        action.join(5.0)

    out = capsys.readouterr()
    assert code == 0, out.err
    assert "all 10 messages left the flow" in out.out
    uplink = r.xrange(FlowKeys(flow_name).uplink)
    assert [json.loads(f[b"data"])["type"] for _, f in uplink] == ["order", "payment"] * 5
    assert r.xlen(FlowKeys(flow_name).sink) == 1 + 5


def test_the_example_finds_the_nodes_in_redis_and_gives_up_at_its_deadline(example, ingest, r, redis_url,
                                                                           flow_name, capsys):
    # A live peer's status, as a peer writes it: the example dials the address found there.
    FlowStore(r, FlowKeys(flow_name), "node-a").write_status({"role": "master", "grpc_address": ingest})
    assert example.node_addresses(r, flow_name) == [ingest]

    began = time.monotonic()
    code = example.main(["--flow", flow_name, "--pairs", "2", "--redis", redis_url, "--deadline", "0.5"])
    elapsed = time.monotonic() - began

    out = capsys.readouterr()
    assert code == 1
    assert "4 of 4 messages not in" in out.err  # nothing plays the flow here
    assert r.xlen(FlowKeys(flow_name).uplink) == 4  # but they were published
    assert 0.5 <= elapsed < 3.0
