"""What a member records for an operator's console, driven by hand on a real Redis
(cluster/member.py, cluster/member_timers.py): its status's time, last batch and what each node
holds, as ``FlowStore.read_statuses`` reads them back."""

from __future__ import annotations

import json

from tests.conftest import wait_until
from tests.integration.test_node_parts import FLOW, node
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph

PAIR_FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
message: {{id: id}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
  claims: {{type: sort, pairs_with: deliver, key: seq, key_type: int, bake_time: 5.0}}
cluster: {{redis_checks: warn}}
"""


def status_of(member) -> dict:
    """The member's status as Redis holds it (what `twinflow status` and a console read)."""
    rows = {row["peer_id"]: row for row in member.store.read_statuses()}
    return rows.get(member.cfg.peer_id, {})


def rows_of(member, *docs) -> list[tuple]:
    r, up = member.store.r, member.keys.uplink
    for doc in docs:
        r.xadd(up, {"data": json.dumps(doc)})
    return [(eid.decode(), f[b"data"], None) for eid, f in r.xrange(up)][-len(docs):]


def test_a_masters_status_has_its_time_its_last_batch_and_what_each_node_holds(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    a = node(graph, "a", redis_url, clock, tmp_path)
    try:
        # Before the first batch: the batch fields are there, at 0; the master's nodes are not.
        first = wait_until(lambda: status_of(a), 10.0, what="a's first status")
        assert float(first["at"]) == 1000.0
        assert (first["last_batch_at"], first["last_batch_size"], first["last_batch_s"]) == ("0.0", "0", "0.0")
        assert first["pending_nodes"] == {}

        a.parts.leader.is_master = True
        a.on_promoted(1)
        clock.advance(2.0)
        a.on_batch(0, rows_of(a, {"id": "o1", "type": "order", "order_id": 1},
                              {"id": "o2", "type": "order", "order_id": 2},
                              {"id": "p1", "type": "payment", "order_id": 1}))
        clock.advance(0.5)
        a.wake.set()
        row = wait_until(lambda: (s := status_of(a)).get("last_batch_size") == "3" and s, 10.0,
                         what="a status after the batch")
        assert float(row["at"]) == 1002.5 and float(row["last_batch_at"]) == 1002.0
        assert 0.0 <= float(row["last_batch_s"]) < 10.0
        # Decoded from JSON: o1 and p1 joined and left, o2 waits for its payment in a group.
        assert row["pending_nodes"] == {"match": {"kind": "join", "held": 1, "groups": 1},
                                        "deliver": {"kind": "action", "held": 0, "retries": 0, "behind": 0}}
        assert row["pending"] == "1"  # the sum, as before
    finally:
        a.parts.peer.stop()


def test_a_workers_status_shows_the_claim_pairs_sort_baking_then_overdue(redis_url, flow_name, tmp_path):
    graph = parse_graph(PAIR_FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    b = node(graph, "b", redis_url, clock, tmp_path)
    try:
        b.on_batch(0, rows_of(b, {"id": "m1", "seq": 1}, {"id": "m2", "seq": 2}))
        b.wake.set()
        row = wait_until(lambda: (s := status_of(b)).get("last_batch_size") == "2" and s, 10.0,
                         what="b's status after the batch it baked")
        assert row["role"] == "worker"
        # The master's nodes are not run here: only the pair's sort, which the worker runs.
        assert row["pending_nodes"] == {"claims": {"kind": "sort", "held": 2, "baking": 2, "overdue": 0,
                                                   "rulesets": {"all": {"baking": 2, "overdue": 0}}}}
        clock.advance(6.0)  # past the bake time: baked fully, unclaimed, still held
        b.wake.set()
        row = wait_until(lambda: (s := status_of(b))["pending_nodes"]["claims"]["overdue"] == 2 and s, 10.0,
                         what="the baked messages overdue")
        assert row["pending_nodes"]["claims"] == {"kind": "sort", "held": 2, "baking": 0, "overdue": 2,
                                                  "rulesets": {"all": {"baking": 0, "overdue": 2}}}
    finally:
        b.parts.peer.stop()
