"""The rule that decides "processed" (cluster/master_flow.py), per node kind, against a real Redis.

A message is processed once the step that ran it is committed: its ID is in
the ID cache, the processed mark is past its position, and its effect is in
Redis: on an outlink's stream, or held in the node's state entries. Such a
message is never run through the flow again (the master skips it, and a
promoted worker's catch-up starts after the mark).
"""

import json

import pytest
import redis

from tests.cluster.every_node import graph, stream_suffix
from twinflow.cluster.master_flow import MasterFlow
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
# (what the message is, its document, where its effect is: ("out", node, outlink) or ("state", node))
CASES = [
    ("an order waits in an AND join", {"id": "o1", "type": "order", "order_id": 1}, ("state", "match")),
    ("its payment completes the join and is delivered", {"id": "p1", "type": "payment", "order_id": 1},
     ("out", "deliver", "done")),
    ("an original waits in its aggregation", {"id": "imf1", "type": "IMF", "recipients": "a@x"},
     ("state", "monitor")),
    ("its notification completes it", {"id": "mdn1", "type": "MDN", "parent_id": "imf1", "final_recipient": "a@x"},
     ("out", "monitor", "complete")),
    ("a step waits for the one before it", {"id": "s2", "type": "step", "grp": "g", "n": 2}, ("state", "reorder")),
    ("the first step is numbered", {"id": "s0", "type": "step", "grp": "g", "n": 0}, ("out", "number", "out")),
    ("an alert passes the XOR join and opens its window", {"id": "a1", "type": "alert", "host": "h"},
     ("out", "once_per_host", "passed")),
    ("a reading leaves the sort", {"id": "r1", "type": "reading", "n": 4}, ("out", "readings", "done")),
    ("a repeated UUID is a duplicate", {"id": "o1-again", "uuid": "o1", "type": "order", "order_id": 2},
     ("out", "guard", "duplicate")),
    ("bad input goes to a failure outlink", {"id": "bad", "type": "step", "grp": "g", "n": "x"},
     ("out", "reorder", "failure")),
]


@pytest.fixture
def store(redis_url, flow_name):
    s = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name, "uplink", "sink"), "node-a")
    s.raise_epoch(1)
    yield s
    s.close()


def test_each_nodes_effect_is_recorded_in_the_step_that_processes_the_message(store):
    g = graph()
    flow = MasterFlow.load(g, store)
    for n, (what, doc, effect) in enumerate(CASES, 1):
        msg = Message(doc["id"], None, f"{n}-0", json.dumps(doc).encode(), doc)
        assert store.processed([msg]) == [False], what
        store.commit(1, flow.run([msg], now=float(n), epoch=1))
        assert store.processed([msg]) == [True], what
        assert store.processed_mark() == f"{n}-0", what
        if effect[0] == "out":
            ids = [f[b"id"].decode() for _, f in store.r.xrange(store.keys.prefix + stream_suffix(g, *effect[1:]))]
            assert any(doc["id"] in i.split("+") for i in ids), what
        else:
            entries = store.r.hvals(store.keys.state(effect[1]))
            assert any(f'"{doc["id"]}"' in e.decode() for e in entries), what


def test_a_new_master_loads_what_the_old_one_held(store):
    g = graph()
    old = MasterFlow.load(g, store)
    order = {"id": "o7", "type": "order", "order_id": 7}
    store.commit(1, old.run([Message("o7", None, "1-0", b"", order)], now=100.0, epoch=1))
    new = MasterFlow.load(g, store)
    assert new.pending() == 1 and new.next_deadline() == 115.0
    payment = {"id": "p7", "type": "payment", "order_id": 7}
    store.raise_epoch(2)
    store.commit(2, new.run([Message("p7", None, "2-0", b"", payment)], now=101.0, epoch=2))
    sink = [f[b"id"] for _, f in store.r.xrange(store.keys.sink)]
    assert sink == [b"o7+p7"] and store.r.hlen(store.keys.state("match")) == 0
