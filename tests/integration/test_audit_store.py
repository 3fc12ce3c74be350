"""The audit of failed messages against a real redis-server: FAILED entries written with the
master's step, resubmit (exactly once more, refused the second time), discard, unknown IDs,
trimming that counts what went unhandled, and the publishers' notices with their cursor.

The flow runs through the real ``MasterSession`` (ID cache, processed mark, fenced COMMIT) over
what the uplink holds, decoded as a peer decodes it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from twinflow.cluster.flow_audit import RESUBMITS
from twinflow.cluster.master_session import MasterSession
from twinflow.cluster.uplink_rows import decode_rows, record_bad
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.nodes.action import TransientError
from twinflow.runtime.store.audit import AuditError, AuditFilter, AuditStore
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.notices import read_notices
from twinflow.runtime.resubmit import envelope

CALLS: list[str] = []      # every handler call, by message ID
BROKEN: set[str] = set()   # IDs whose delivery fails for good (a service error)
BUSY: dict[str, int] = {}  # ID -> transient failures still to come


def deliver(msg) -> None:
    CALLS.append(msg.id)
    if BUSY.get(msg.id, 0) > 0:
        BUSY[msg.id] -= 1
        raise TransientError("the service is busy")
    if msg.id in BROKEN:
        raise RuntimeError(f"the service refused {msg.id}")


FLOW = """\
flow: f
uplink: {stream: uplink}
message: {id: id, id_ttl: 600}
audit: {retention: 3600, max_entries: 1000}
notices: {outlinks: [check.failure], max_entries: 5}
input: check
nodes:
  check: {type: join, join_type: or, types: [order], links: {passed: deliver}}
  deliver: {type: action, handler: "tests.integration.test_audit_store:deliver", max_retries: 1,
            retry_interval: 5.0, sink: {stream: sink}}
"""
GRAPH = parse_graph(FLOW)


@pytest.fixture(autouse=True)
def service():
    CALLS.clear(), BROKEN.clear(), BUSY.clear()


class Master:
    """A master of the flow on ``store``: runs what the uplink holds after what it ran."""

    def __init__(self, store: FlowStore):
        self.store, self.after = store, None
        self.session = MasterSession(GRAPH, store, 1, ThreadPoolExecutor(1))

    def run(self, now: float) -> None:
        rows = self.store.read_uplink(self.after, "+", 1000, 1 << 20)
        if rows:
            msgs, bad, _ = decode_rows(rows, GRAPH.cluster.message)
            record_bad(self.store, GRAPH.cluster, bad)
            out = self.session.run_batch(msgs, rows[-1][0], now=lambda: now)
            assert out.rest is None and out.refused is None
            self.after = rows[-1][0]

    def fire(self, now: float) -> None:
        assert self.session.fire(now).refused is None


def publish(store: FlowStore, *docs: dict, publisher: str = "") -> list[str]:
    return store.publish([json.dumps(d).encode() for d in docs], publisher=publisher,
                         message_ids=[str(d["id"]) for d in docs])


def test_a_service_error_is_audited_with_the_step_and_its_resubmit_runs_exactly_once_more(store):
    audit, master = AuditStore(store), Master(store)
    BROKEN.add("o1")
    publish(store, {"id": "o1", "type": "order"}, {"id": "o2", "type": "order"}, publisher="shop")
    master.run(10.0)
    assert CALLS == ["o1", "o2"]
    (entry,) = audit.entries()
    assert (entry.status, entry.node, entry.fields["outlink"]) == ("FAILED", "deliver", "error")
    assert entry.fields["id"] == "o1"
    assert entry.reason == "service error: RuntimeError: the service refused o1"
    assert (entry.fields["flow"], entry.fields["peer"], entry.fields["epoch"]) == (store.keys.flow, "peer-a", "1")
    assert float(entry.fields["at"]) == 10.0 and json.loads(entry.data) == {"id": "o1", "type": "order"}
    assert entry.fields["position"] == store.r.xrange(store.keys.uplink, count=1)[0][0].decode()

    BROKEN.clear()  # the service is fixed
    mark = audit.resubmit(entry.id, "ops-anna")
    assert (mark["status"], mark["by"]) == ("RESUBMITTED", "ops-anna") and mark["position"]
    with pytest.raises(AuditError) as again:
        audit.resubmit(entry.id, "ops-ben")
    assert again.value.kind == "marked" and "already resubmitted at" in again.value.reason
    assert "by ops-anna" in again.value.reason
    master.run(20.0)
    master.run(21.0)  # nothing new: the resubmit ran in the step before
    assert CALLS == ["o1", "o2", "o1"]  # once more, though "o1" is in the ID cache, under its original ID
    assert [f[b"id"] for _, f in store.r.xrange(store.keys.sink)] == [b"o2", b"o1"]
    shown = audit.entry(entry.id)
    assert shown.status == "RESUBMITTED" and shown.outcome["outlink"] == "done" and shown.outcome["at"] == 20.0
    assert store.r.hlen(store.keys.state(RESUBMITS)) == 0  # it left: the flow holds no resubmit
    assert audit.counts()["failed"] == 0


def test_a_resubmit_that_fails_again_is_a_new_entry_naming_the_one_it_came_from(store):
    audit, master = AuditStore(store), Master(store)
    BROKEN.add("o1")
    publish(store, {"id": "o1", "type": "order"})
    master.run(1.0)
    (first,) = audit.entries()
    audit.resubmit(first.id, "ops")
    master.run(2.0)
    second = audit.entries()  # FAILED entries only: the first is RESUBMITTED
    assert [(e.fields["id"], e.fields["resubmit_of"]) for e in second] == [("o1", first.id)]
    outcome = audit.entry(first.id).outcome
    assert (outcome["outlink"], outcome["failed"]) == ("error", True)
    assert len(audit.entries(AuditFilter(status=""))) == 2


def test_a_resubmit_held_for_a_retry_records_its_outcome_when_it_leaves_under_a_new_master(store):
    audit, master = AuditStore(store), Master(store)
    BROKEN.add("o1")
    publish(store, {"id": "o1", "type": "order"})
    master.run(1.0)
    (entry,) = audit.entries()
    BROKEN.clear()
    BUSY["o1"] = 1  # the first attempt of the resubmit waits for a retry
    audit.resubmit(entry.id, "ops")
    master.run(2.0)
    assert audit.entry(entry.id).outcome is None
    assert store.r.hgetall(store.keys.state(RESUBMITS)) == {b"o1": json.dumps([entry.id]).encode()}
    successor = Master(store)  # a new master: loads the flow, the retry and the resubmit in flight
    successor.after = master.after
    successor.fire(7.0)
    assert CALLS == ["o1", "o1", "o1"]
    outcome = audit.entry(entry.id).outcome
    assert (outcome["outlink"], outcome["at"]) == ("done", 7.0)
    assert store.r.hlen(store.keys.state(RESUBMITS)) == 0


def test_a_resubmit_of_a_flow_input_failure_reenters_at_the_node_it_failed_at(store):
    audit, master = AuditStore(store), Master(store)
    publish(store, {"id": "x1", "type": "return"})  # the OR join takes orders only: nohit, not audited
    publish(store, {"id": "x2"})                    # no type field: the join's failure outlink
    master.run(1.0)
    (entry,) = audit.entries()
    assert (entry.node, entry.fields["outlink"]) == ("check", "failure") and "no field 'type'" in entry.reason
    audit.resubmit(entry.id, "ops")
    master.run(2.0)
    assert audit.entry(entry.id).outcome["outlink"] == "failure"  # the same node judged it again
    assert CALLS == []


def test_an_envelope_naming_a_node_the_flow_has_not_leaves_by_the_failure_stream(store):
    audit, master = AuditStore(store), Master(store)
    store.r.xadd(store.keys.uplink, {"data": envelope("1-0", "nowhere", {"id": "o9", "type": "order"})})
    publish(store, {"id": "o10", "type": "order"})  # the flow goes on
    master.run(1.0)
    (entry,) = audit.entries()
    assert entry.node == "" and "names node 'nowhere', which this flow's graph does not have" in entry.reason
    assert [f[b"id"] for _, f in store.r.xrange(store.keys.sink)] == [b"o10"] and CALLS == ["o10"]


def test_an_unknown_audit_id_is_refused_and_changes_nothing(store):
    audit = AuditStore(store)
    for call in (audit.resubmit, audit.discard):
        for audit_id in ("1700000000000-0", "not-an-id"):
            with pytest.raises(AuditError) as err:
                call(audit_id, "ops")
            assert err.value.kind == "missing" and f"no audit entry {audit_id!r}" in err.value.reason
    assert store.r.exists(store.keys.uplink, store.keys.audit_marks) == 0
    assert audit.entry("1700000000000-0") is None


def test_a_discarded_entry_is_marked_and_can_no_longer_be_resubmitted(store):
    audit, master = AuditStore(store), Master(store)
    BROKEN.add("o1")
    publish(store, {"id": "o1", "type": "order"})
    master.run(1.0)
    (entry,) = audit.entries()
    mark = audit.discard(entry.id, "ops-anna")
    assert (mark["status"], mark["by"]) == ("DISCARDED", "ops-anna") and "position" not in mark
    with pytest.raises(AuditError, match="already discarded at .* by ops-anna"):
        audit.resubmit(entry.id, "ops-ben")
    with pytest.raises(AuditError, match="already discarded"):
        audit.discard(entry.id, "ops-ben")
    assert store.r.xlen(store.keys.uplink) == 1 and audit.entries() == []
    assert [e.status for e in audit.entries(AuditFilter(status="DISCARDED"))] == ["DISCARDED"]


def test_a_mark_sent_again_after_a_lost_reply_answers_as_the_first_and_writes_one_envelope(store):
    audit, master = AuditStore(store), Master(store)
    BROKEN.add("o1")
    publish(store, {"id": "o1", "type": "order"})
    master.run(1.0)
    (entry,) = audit.entries()
    args = [entry.id, "RESUBMITTED", "ops", "token-1", b'{"twinflow_resubmit": {}}']
    keys = [store.keys.audit, store.keys.audit_marks, store.keys.uplink]
    first = store.scripts["audit_mark"](keys=keys, args=args)
    again = store.scripts["audit_mark"](keys=keys, args=args)
    assert first == again and int(first[0]) == 1
    assert store.r.xlen(store.keys.uplink) == 2  # the message, and one envelope


def test_bad_input_is_audited_and_a_body_the_flow_cannot_read_is_not_resubmitted(store):
    audit, master = AuditStore(store), Master(store)
    store.r.xadd(store.keys.uplink, {"data": b"\xff{"})
    store.r.xadd(store.keys.uplink, {"data": b'{"type": "order"}'})
    master.run(1.0)
    entries = audit.entries()
    assert [(e.node, e.fields["outlink"]) for e in entries] == [("", ""), ("", "")]
    assert "not JSON" in entries[0].reason and "no ID field 'id'" in entries[1].reason
    assert {e.fields["position"] for e in entries} == {i.decode() for i, _ in store.r.xrange(store.keys.uplink)}
    with pytest.raises(AuditError) as err:
        audit.resubmit(entries[0].id, "ops")
    assert err.value.kind == "unusable" and "not a JSON object" in err.value.reason
    # Recorded once whichever peer sees it: a second record of the same positions adds nothing.
    record_bad(store, GRAPH.cluster, [(entries[0].fields["position"], "again", b"\xff{", 2)])
    assert len(audit.entries(AuditFilter(status=""))) == 2


def test_filters_take_node_reason_and_time(store):
    audit, master = AuditStore(store), Master(store)
    BROKEN.update({"o1", "o2"})
    publish(store, {"id": "o1", "type": "order"}, {"id": "y"})
    master.run(1.0)
    assert [e.fields["id"] for e in audit.entries(AuditFilter(node="deliver"))] == ["o1"]
    assert [e.fields["id"] for e in audit.entries(AuditFilter(reason="no field"))] == ["y"]
    first_ms = int(audit.entries()[0].id.split("-")[0])
    assert audit.entries(AuditFilter(until=first_ms / 1000 - 1)) == []
    assert len(audit.entries(AuditFilter(since=first_ms / 1000))) == 2
    assert len(audit.entries(limit=1)) == 1


def test_trimming_removes_by_age_and_count_and_counts_what_was_still_failed(store):
    audit = AuditStore(store)
    for ms in range(1000, 1010):  # ten entries written at 1.000 s .. 1.009 s
        store.r.xadd(store.keys.audit, {"node": "deliver", "id": f"m{ms}", "data": "{}"}, id=f"{ms}-0")
    audit.discard("1000-0", "ops")
    audit.discard("1009-0", "ops")
    # Older than 5 ms before 1.010 s: 1000..1004, of which 1000 was handled.
    result = audit.trim(retention_s=0.005, max_entries=100, now_s=1.010)
    assert (result.removed, result.unhandled, result.more, result.entries, result.failed) == (5, 4, False, 5, 4)
    # Beyond the newest 2: 1005..1007 (all still FAILED), at most 2 in one call.
    result = audit.trim(retention_s=100, max_entries=2, now_s=1.010, budget=2)
    assert (result.removed, result.unhandled, result.more) == (2, 2, True)
    result = audit.trim(retention_s=100, max_entries=2, now_s=1.010)
    assert (result.removed, result.unhandled, result.entries, result.failed) == (1, 1, 2, 1)
    assert [i for i, _ in store.r.xrange(store.keys.audit)] == [b"1008-0", b"1009-0"]
    assert store.r.hkeys(store.keys.audit_marks) == [b"1009-0"]  # the marks go with their entries
    counts = audit.counts()
    assert (counts["removed"], counts["removed_unhandled"], counts["entries"], counts["failed"]) == (8, 7, 2, 1)


def test_notices_reach_their_publisher_in_order_with_a_cursor_and_the_cap_counts_what_it_removes(store):
    master = Master(store)
    BROKEN.update({"o1", "o2", "o4"})
    publish(store, {"id": "o1", "type": "order"}, {"id": "o2", "type": "order"}, publisher="shop")
    publish(store, {"id": "o3", "type": "order"}, {"id": "o4", "type": "order"}, publisher="kiosk")
    publish(store, {"id": "z1"}, publisher="shop")  # the join's failure: a noticed outlink
    master.run(1.0)
    page, cursor = read_notices(store, "shop", max_count=1)
    assert [(n["id"], n["node"], n["outlink"]) for n in page] == [("o1", "deliver", "error")]
    assert "service error" in page[0]["reason"] and page[0]["publisher"] == "shop"
    rest, cursor = read_notices(store, "shop", after=cursor)
    assert [n["id"] for n in rest] == ["o2", "z1"]
    assert read_notices(store, "shop", after=cursor) == ([], cursor)  # nothing newer: the same cursor
    assert [n["id"] for n in read_notices(store, "kiosk")[0]] == ["o4"]
    with pytest.raises(ValueError, match="not a notice cursor"):
        read_notices(store, "shop", after="yesterday")
    for n in range(300):  # the stream keeps about 5 (notices.max_entries): whole nodes are removed
        BROKEN.add(f"q{n}")
    publish(store, *({"id": f"q{n}", "type": "order"} for n in range(300)))
    master.run(2.0)
    kept = store.r.xlen(store.keys.notices)
    assert kept < 304 and int(store.r.get(store.keys.notices_removed)) == 304 - kept  # o1, o2, z1, o4 and 300
