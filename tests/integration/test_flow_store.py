"""The Redis store against a real redis-server: fencing, the ID cache, failures, outages."""

import subprocess
import threading
import time

import pytest
import redis

from twinflow.cluster.services import free_port, redis_answers
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_store import FlowKeys, FlowStore, Fenced
from tests.conftest import wait_until


def msgs(*ids):
    return [Message(id=i, key=n, position=f"{n + 1}-0", body=b'{"x":1}') for n, i in enumerate(ids)]


@pytest.fixture
def store(redis_url, flow_name):
    s = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "node-a", id_ttl=600)
    yield s
    s.close()


def test_deliver_records_ids_and_never_delivers_twice(store):
    store.raise_epoch(1)
    assert store.deliver(1, msgs("a", "b")) == [True, True]
    assert store.deliver(1, msgs("b", "c")) == [False, True]
    sink = store.r.xrange(store.keys.sink)
    assert [f[b"id"] for _, f in sink] == [b"a", b"b", b"c"]
    assert {f[b"epoch"] for _, f in sink} == {b"1"}
    assert store.processed(["a", "c", "zz"]) == [True, True, False]
    assert 0 < store.r.ttl(store.keys.id_prefix + "a") <= 600  # bounded ID cache


def test_stale_epoch_changes_nothing(store):
    assert store.raise_epoch(3) == 3
    assert store.raise_epoch(2) == 3  # epochs never go back
    with pytest.raises(Fenced) as err:
        store.deliver(2, msgs("a"))
    assert err.value.newest == 3
    assert store.r.xlen(store.keys.sink) == 0
    assert store.processed(["a"]) == [False]
    assert store.deliver(3, msgs("a")) == [True]


def test_failures_are_recorded_once_whichever_node_sees_them(redis_url, flow_name):
    a = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "node-a")
    b = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "node-b")
    assert a.record_failures([("7-0", "body is not JSON", b"{")]) == 1
    assert b.record_failures([("7-0", "body is not JSON", b"{"), ("8-0", "no key", None)]) == 1
    rows = a.r.xrange(a.keys.failure)
    assert [(f[b"position"], f[b"reason"]) for _, f in rows] == [(b"7-0", b"body is not JSON"), (b"8-0", b"no key")]


def test_uplink_lag_counts_unread_entries(store):
    store.publish([b"{}"] * 5)
    assert store.uplink_lag("node-a") == 5
    store.r.hset(store.keys.read("node-a"), mapping={"read_n": 3, "read_id": "x"})
    assert store.uplink_lag("node-a") == 2


def test_delivery_waits_for_redis_and_loses_nothing(tmp_path):
    """Redis down when the write starts: the store waits and retries, then delivers once."""
    port = free_port()
    retries = []

    def sleep(seconds):
        retries.append(seconds)
        time.sleep(seconds)

    s = FlowStore(redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2), FlowKeys("down"), "node-a", sleep=sleep)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("flags", s.deliver(0, msgs("a", "b"))))
    t.start()
    wait_until(lambda: len(retries) >= 1, 30, what="the store to retry")
    assert t.is_alive(), "delivery returned although Redis is down"
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: redis_answers(port), 10, what="redis-server")
        t.join(timeout=15)
        assert result["flags"] == [True, True]
        assert s.r.xlen(s.keys.sink) == 2
    finally:
        s.close()
        server.kill()
        server.wait()
