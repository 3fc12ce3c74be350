"""The flow's events stream against a real redis-server (runtime/store/flow_events.py): records
read back newest first with their nested fields, the stream's cap, and a write to a Redis that is
gone returning False at once instead of raising."""

from __future__ import annotations

import time

import redis

from tests.conftest import wait_until
from twinflow.runtime.store.flow_events import EVENTS_MAX
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.testing.servers import redis_answers


def record(n: int, **fields) -> dict:
    return {"event": "promoted", "peer": "a", "epoch": n, "at": 1000.0 + n / 1000, **fields}


def test_records_come_back_newest_first_with_their_fields(redis_url, flow_name):
    store = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "a")
    phases = {"promoted_at": 1000.25, "old": {"peer": "b", "lost": [1, 2.5, None]}}
    assert store.add_events([record(1, rolled_back=3, warm_state=True, phases=phases),
                             {"event": "demoted", "peer": "a", "epoch": None, "at": 1001.5, "reason": "fenced"}])
    assert store.add_events([record(2, promoted_at=1002.125)])
    assert store.add_events([])  # nothing to add: nothing sent

    newest, demoted, first = store.events()
    assert newest["event"] == "promoted" and newest["epoch"] == 2 and newest["promoted_at"] == 1002.125
    assert demoted == {"id": demoted["id"], "event": "demoted", "peer": "a", "epoch": None, "at": 1001.5,
                       "reason": "fenced"}
    assert first["rolled_back"] == 3 and first["warm_state"] is True and first["phases"] == phases
    assert first["at"] == 1000.001 and isinstance(first["epoch"], int)
    assert newest["id"] > demoted["id"] > first["id"]  # stream IDs: in the order they were added
    assert [e["epoch"] for e in store.events(count=1)] == [2]
    # The key is the flow's, in its hash slot.
    assert store.keys.events == f"tf:{{{flow_name}}}:events"


def test_the_stream_keeps_about_its_cap(redis_url, flow_name):
    store = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "a")
    for start in range(0, 3 * EVENTS_MAX, 250):
        assert store.add_events([record(n) for n in range(start, start + 250)])
    length = store.r.xlen(store.keys.events)
    # MAXLEN ~ trims whole nodes of the stream (100 entries by default): about the cap, never far past.
    assert EVENTS_MAX <= length < EVENTS_MAX + 200, length
    assert store.events(count=1)[0]["epoch"] == 3 * EVENTS_MAX - 1


def test_adding_to_a_redis_that_is_gone_returns_false_at_once(own_redis, flow_name):
    port, proc = own_redis()
    store = FlowStore(redis.Redis(port=port, socket_timeout=1.0, socket_connect_timeout=1.0),
                      FlowKeys(flow_name), "a")
    assert store.add_events([record(1)])
    proc.kill()  # reaped by the fixture
    wait_until(lambda: not redis_answers(port), 10, what="redis-server gone")
    began = time.monotonic()
    assert store.add_events([record(2)]) is False  # no exception: the caller keeps the record
    assert time.monotonic() - began < 5.0  # one attempt, not the store's retries up to its deadline
