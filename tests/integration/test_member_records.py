"""What a member records for an operator's console, driven by hand on a real Redis
(cluster/member.py, cluster/member_timers.py, cluster/member_events.py): its status's time, last
batch and what each node holds, as ``FlowStore.read_statuses`` reads them back; and its records of
role changes in the flow's events stream, as ``FlowStore.events`` reads them."""

from __future__ import annotations

import json
import os
import signal

import redis

from tests.conftest import wait_until
from tests.integration.test_node_parts import FLOW, SimulatedParts, node
from twinflow.cluster.member_events import QUEUE_MAX
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_store import FlowStore

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


# -- the events stream: what a member records of its role changes (cluster/member_events.py) --------
def events_of(member, name: str) -> list[dict]:
    return [e for e in member.store.events(count=200) if e["event"] == name]


def test_a_promotion_is_recorded_with_its_phases_the_old_masters_last_sign_and_its_first_write(
        redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    a = node(graph, "a", redis_url, clock, tmp_path)
    try:
        # b was master: its status says so, with its last batch after its last status.
        b = FlowStore(a.store.r, a.keys, "b")
        b.write_status({"peer_id": "b", "role": "master", "at": 990.0, "last_batch_at": 991.5}, ttl_s=60)
        leader = a.parts.leader
        leader.elected_at, leader.previous_master, leader.is_master = 995.0, "b", True
        a.on_promoted(2)
        [promoted] = wait_until(lambda: events_of(a, "promoted"), 10.0, what="the promoted record")
        assert promoted["peer"] == "a" and promoted["epoch"] == 2 and promoted["old_master"] == "b"
        assert promoted["master_lost_at"] == 991.5 and promoted["session_expired_at"] == 995.0
        assert promoted["promoted_at"] == promoted["state_loaded_at"] == promoted["rolled_back_at"] == 1000.0
        assert promoted["rolled_back"] == 0 and promoted["warm_state"] is False
        assert {"batch_wait_s", "epoch_s", "state_load_s", "catch_up_s"} <= set(promoted)  # the log line's too
        assert events_of(a, "first_write") == []  # nothing written yet

        clock.advance(1.5)
        a.on_batch(0, rows_of(a, {"id": "o1", "type": "order", "order_id": 1}))  # its step holds it in the join
        clock.advance(1.0)
        a.on_batch(1, rows_of(a, {"id": "p1", "type": "payment", "order_id": 1}))
        a.wake.set()
        [first] = wait_until(lambda: events_of(a, "first_write"), 10.0, what="the first_write record")
        assert first["epoch"] == 2 and first["first_write_at"] == first["at"] == 1001.5
        assert first["since_promoted_s"] == 1.5
        assert [e["event"] for e in a.store.events()][:2] == ["first_write", "promoted"]  # once a term, newest first

        # Handed over, then promoted again: b's status is newer than this election, so b was alive
        # after it (it let go): no master_lost_at.
        leader.handover = lambda timeout_s: {"ok": True, "new_master": "b", "seconds": 0.02}
        assert a.handover(1.0, by="SIGTERM")["ok"]
        a.on_demoted("handover")
        b.write_status({"peer_id": "b", "role": "master", "at": 1004.0}, ttl_s=60)
        leader.elected_at = 1003.5
        clock.set(1004.5)
        a.on_promoted(3)
        again = wait_until(lambda: [e for e in events_of(a, "promoted") if e["epoch"] == 3], 10.0,
                           what="the second promoted record")[0]
        assert "master_lost_at" not in again and again["session_expired_at"] == 1003.5
        assert again["promoted_at"] == 1004.5
        [handover] = events_of(a, "handover")
        assert (handover["by"], handover["ok"], handover["new_master"], handover["epoch"]) == ("SIGTERM", True, "b", 2)
        [demoted] = events_of(a, "demoted")
        assert demoted["reason"] == "handover" and demoted["epoch"] == 2
        assert events_of(a, "started") and a.status()["events_dropped"] == 0
    finally:
        a.parts.peer.stop()


class StalledRedisParts(SimulatedParts):
    """A store whose calls give up after a second: its Redis is stopped (SIGSTOP) by the test."""

    def store(self, member):
        return FlowStore(redis.Redis.from_url(self.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0),
                         member.keys, member.cfg.peer_id)


def test_records_wait_for_redis_and_the_newest_are_kept_when_they_are_too_many(own_redis, flow_name, tmp_path):
    port, proc = own_redis()
    graph = parse_graph(FLOW.format(name=flow_name))
    a = node(graph, "a", f"redis://127.0.0.1:{port}/0", FakeClock(1000.0), tmp_path, parts=StalledRedisParts)
    try:
        wait_until(lambda: events_of(a, "started") and not a.events.queued(), 10.0, what="the started record")
        os.kill(proc.pid, signal.SIGSTOP)
        for n in range(QUEUE_MAX + 50):
            a.events.note("suspended", {"epoch": 1, "node": "deliver", "n": n})  # from any thread, no Redis call
        assert a.events.dropped == 50 and len(a.events.queued()) == QUEUE_MAX
        assert a.events.flush() is False  # one attempt: Redis does not answer; nothing raised, nothing lost
        assert len(a.events.queued()) == QUEUE_MAX
        os.kill(proc.pid, signal.SIGCONT)
        wait_until(lambda: not a.events.queued(), 15.0, what="the queue written by the timer rounds")
        written = [e["n"] for e in reversed(events_of(a, "suspended"))]
        assert written == list(range(50, QUEUE_MAX + 50))  # the newest, in order, each once
        assert a.status()["events_dropped"] == 50
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        a.parts.peer.stop()
