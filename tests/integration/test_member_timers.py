"""A member's timers keep firing (cluster/member_timers.py, cluster/master_side.py): after a
round that met an error, and for a master whose flow was dropped after its last batch.

Either fault leaves a master taking batches but firing no time-out once the batches stop
and, for a timer thread that died, writing no status: what one rolling restart between
hosts showed (chaos/RESULTS.md, "The rolling restart that left 158 messages out")."""

from __future__ import annotations

import json

from tests.conftest import wait_until
from tests.integration.test_node_parts import FLOW, SimulatedParts, Stub, node
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph


class PaceFailsOnce(Stub):
    """A reading whose pace raises when armed, once, as a control file's write can."""

    def __init__(self):
        super().__init__()
        self.armed, self.paces = False, []

    def pace(self, member, interval_ms, behind_ms=0):
        if self.armed:
            self.armed = False
            raise FileNotFoundError("pace.tmp")
        self.paces.append((interval_ms, behind_ms))  # the paces set


class PaceParts(SimulatedParts):
    def reading(self, peer, starts):
        self.peer, self.stream = peer, PaceFailsOnce()
        return self.stream


def test_a_timer_round_whose_pace_raises_does_not_stop_the_timers(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    a = node(graph, "a", redis_url, FakeClock(1000.0), tmp_path, parts=PaceParts)
    try:
        stream = a.parts.stream
        a.parts.leader.is_master = True
        a.on_promoted(1)  # the master's pace, (0, 0), set by the promotion
        assert stream.paces[-1] == (0, 0)
        stream.armed = True
        a.master.step_down("test")  # a worker now: the next round sets the worker's pace, which raises
        a.wake.set()
        wait_until(lambda: not stream.armed, 10.0, what="the round whose pace raises")
        # The timer thread lives on: a later round sets the worker's pace after all (the start's
        # and the promotion's were the first two).
        a.wake.set()
        wait_until(lambda: len(stream.paces) == 3, 10.0, what="a later round setting the pace again")
        assert stream.paces[-1] == (a.cfg.worker_pace_ms, a.cfg.worker_read_behind_ms)
    finally:
        a.parts.peer.stop()


def test_a_master_whose_flow_was_dropped_fires_its_time_outs_without_a_batch(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name).replace("links: {joined: deliver}",
                                                            "links: {joined: deliver, expired: deliver}"))
    clock = FakeClock(1000.0)
    a = node(graph, "a", redis_url, clock, tmp_path)
    try:
        r, up = a.store.r, a.keys.uplink
        order = r.xadd(up, {"data": json.dumps({"id": "o1", "type": "order", "order_id": 1})}).decode()
        a.parts.leader.is_master = True
        a.on_promoted(1)
        a.on_batch(0, [(order, r.xrange(up)[0][1][b"data"], None)])
        assert a.status()["pending"] == 1
        a.session.drop()  # as a step that failed leaves it: no batch comes after this one
        clock.advance(11.0)  # past the join's time-out of 10 s
        a.wake.set()
        wait_until(lambda: [f[b"id"] for _, f in r.xrange(a.keys.sink)] == [b"o1"], 10.0,
                   what="the lone order leaving by its time-out")
    finally:
        a.parts.peer.stop()


def test_the_masters_trim_round_trims_the_audit_and_the_metrics_count_what_went_unhandled(redis_url, flow_name,
                                                                                          tmp_path):
    from twinflow.cluster.metrics import PeerCollector
    from twinflow.runtime.store.audit import AuditStore

    graph = parse_graph(FLOW.format(name=flow_name) + "audit: {retention: 60, max_entries: 1000}\n")
    a = node(graph, "a", redis_url, FakeClock(1000.0), tmp_path)
    try:
        r, audit = a.store.r, AuditStore(a.store)
        for ms in (5000, 6000, 7000):  # written 995 s before the flow's time: past the retention of 60 s
            r.xadd(a.keys.audit, {"node": "deliver", "data": "{}"}, id=f"{ms}-0")
        r.xadd(a.keys.audit, {"node": "deliver", "data": "{}"}, id="990000-0")  # 10 s ago: kept
        audit.discard("5000-0", "ops")
        assert a.audit.counts() is None  # a worker never trims
        a.parts.leader.is_master = True
        a.on_promoted(1)
        a.wake.set()
        wait_until(lambda: a.audit.counts() is not None, 10.0, what="the master's trim round")
        assert [i for i, _ in r.xrange(a.keys.audit)] == [b"990000-0"]
        assert a.audit.counts() == {"entries": 1, "failed": 1, "removed": 3, "removed_unhandled": 2,
                                    "notices_removed": 0}
        samples = {(s.name, s.labels["peer"]): s.value for family in PeerCollector(lambda: [a]).collect()
                   for s in family.samples}
        assert samples[("twinflow_audit_removed_unhandled_total", "a")] == 2
        assert samples[("twinflow_audit_failed", "a")] == 1
        assert samples[("twinflow_notices_removed_total", "a")] == 0
    finally:
        a.parts.peer.stop()


def test_the_masters_trim_round_bounds_the_flows_streams_and_counts_what_no_group_read(redis_url, flow_name,
                                                                                      tmp_path, caplog):
    from twinflow.cluster.metrics import PeerCollector

    graph = parse_graph(FLOW.format(name=flow_name) + "streams: {max_entries: 4, retention: 60, "
                                                      "overrides: {match.expired: {max_entries: null}}}\n")
    clock = FakeClock(1000.0)
    a = node(graph, "a", redis_url, clock, tmp_path, trim_interval_s=0.0)  # every round trims
    try:
        r = a.store.r
        sink, expired = a.keys.stream("sink"), a.keys.stream("out:match:expired")
        for s in range(6):  # written 10 .. 5 s before the flow's time: within the retention of 60 s
            r.xadd(sink, {"data": "{}"}, id=f"{990 + s}000-0")
        r.xgroup_create(sink, "billing", id="0")
        r.xreadgroup("billing", "c", {sink: ">"}, count=1)  # billing read the first
        r.xadd(expired, {"data": "{}"}, id="5000-0")    # 995 s old: past the retention
        r.xadd(expired, {"data": "{}"}, id="999000-0")  # 1 s old
        assert a.streams.counts() is None  # a worker never trims
        a.parts.leader.is_master = True
        a.on_promoted(1)
        a.wake.set()
        wait_until(lambda: a.streams.counts() is not None, 10.0, what="the master's trim round")
        counts = a.streams.counts()
        # Six entries over a count of four: the first (read by billing) and the second (not).
        assert counts["sink"] == (2, 1) and r.xlen(sink) == 4
        assert counts["out:match:expired"] == (1, 0) and r.xlen(expired) == 1  # no group: nothing unread
        assert counts["failure"] == counts["notices"] == (0, 0)
        unread = [rec for rec in caplog.records if getattr(rec, "event", "") == "stream_trimmed_unread"]
        assert [(rec.stream, rec.removed, rec.count) for rec in unread] == [("sink", 2, 1)]

        clock.advance(100.0)  # now every sink entry is past the retention, none read by billing
        a.wake.set()
        wait_until(lambda: a.streams.counts()["sink"] == (6, 5), 10.0, what="the round after the clock moved")
        assert r.xlen(sink) == 0
        samples = {(s.name, s.labels["stream"]): s.value for family in PeerCollector(lambda: [a]).collect()
                   for s in family.samples if "stream" in s.labels}
        assert samples[("twinflow_stream_trimmed_unread_total", "sink")] == 5
        assert samples[("twinflow_stream_trimmed_total", "sink")] == 6
        assert samples[("twinflow_stream_trimmed_unread_total", "out:match:expired")] == 0
    finally:
        a.parts.peer.stop()
