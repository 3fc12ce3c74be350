"""Where a master's batch spends its time (``twinflow run --batch-log FILE``): a line per batch
run as master, each phase timed by the code that runs it, none for a batch baked as worker.

The peers are the in-process ones of ``test_node_parts`` (a real Redis, stand-ins for Spark and
ZooKeeper), a batch running ahead of Spark as in a real peer.
"""

import json

import pytest

from twinflow.cluster.batch_phases import BATCH_PHASES, NO_PHASES, PHASES, BatchLog, read_batch_log
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph
from twinflow_dev.flow_bench import breakdown, met, within

from .test_node_parts import FLOW, AheadParts, node


def _rows(r, up, docs):
    for d in docs:
        r.xadd(up, {"data": json.dumps(d)})
    return [(i.decode(), f[b"data"], None) for i, f in r.xrange(up)][-len(docs):]


def test_a_master_writes_one_line_per_batch_with_every_phase_and_a_worker_none(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name).replace("cluster: {redis_checks: warn}",
                                                            "cluster: {redis_checks: warn, step_messages: 10}"))
    log_path = tmp_path / "a.jsonl"
    a = node(graph, "a", redis_url, FakeClock(1000.0), tmp_path, parts=AheadParts, batch_log=str(log_path))
    try:
        r, up = a.store.r, a.keys.uplink
        # As worker: baked, no line.
        a.on_batch(0, _rows(r, up, [{"id": "w1", "type": "order", "order_id": 0}]))
        a.intake.settle_ahead(10)
        assert read_batch_log(str(log_path)) == []

        a.parts.leader.is_master = True
        a.on_promoted(1)
        docs = [{"id": f"o{i}", "type": "order" if i % 2 else "payment", "order_id": i // 2} for i in range(1, 36)]
        a.on_batch(1, _rows(r, up, docs[:25]))
        a.on_batch(2, _rows(r, up, docs[25:]))
        a.intake.settle_ahead(10)
        lines = read_batch_log(str(log_path))
        assert [(b["batch"], b["entries"]) for b in lines] == [(1, 25), (2, 10)]
        for b in lines:
            assert set(PHASES) <= set(b)
            assert b["graph"] > 0 and b["commit"] > 0 and b["decode"] > 0
            # The batch lane's phases are the batch thread's time on it, "other" what the named leave.
            assert sum(b[p] for p in BATCH_PHASES if p != "idle") == pytest.approx(b["took_ms"], abs=0.01)
        assert len(r.xrange(a.keys.sink)) > 0  # the joined pairs left
    finally:
        a.parts.peer.stop()


def test_no_file_no_timing_and_an_unwritable_file_is_given_up_once(caplog):
    off = BatchLog(None)
    assert not off.on and off.begin(3, 0.5) is NO_PHASES
    NO_PHASES.add("graph", 1.0)
    assert NO_PHASES.seconds == {}  # the shared no-op keeps nothing

    full = BatchLog("/dev/full")  # every write fails with ENOSPC, as on a full disk
    phases = full.begin(7, 0.25)
    full.taken(phases, 100)
    phases.add("graph", 0.001)
    full.done(phases)  # no error reaches the batch
    assert not full.on and "cannot be written" in caplog.text
    full.done(full.begin(8, 0.0))  # given up: nothing more is tried or logged
    assert caplog.text.count("cannot be written") == 1


def test_the_breakdown_gives_each_phase_its_quantiles_and_the_batch_lane_its_shares():
    batches = [{"entries": 100, "took_ms": 10.0, **{p: 0.0 for p in PHASES}, "graph": 6.0, "commit": 4.0,
                "idle": 10.0 if i == 0 else 0.0} for i in range(100)]
    b = breakdown(batches)
    assert b["batches"] == 100 and b["graph"]["p50_ms"] == 6.0 and b["idle"]["p99_ms"] == 0.0
    assert b["graph"]["share"] == pytest.approx(600 / 1010, abs=1e-3) and "share" not in b["read"]
    assert breakdown([]) == {"batches": 0}


def test_targets_are_judged_on_the_medians():
    fig = {"ratio_two": {"median": 0.9}, "p50_ratio": {"median": 1.2}, "pair_p99_ms": None, "cpu_ratio": {"median": 1.0}}
    out = met(fig)
    assert out["ratio_two"]["met"] and not out["p50_ratio"]["met"] and out["cpu_ratio"]["met"]
    assert out["pair_p99_ms"] == {"median": None, "target": "<= 100.0", "met": False}


def test_a_bursts_first_batch_counts_only_the_waits_after_the_burst_began():
    quiet_then_burst = {p: 0.0 for p in PHASES} | {"began": 100.0, "at": 100.5, "took_ms": 300.0, "read": 20.0,
                                                   "spark": 30_000.0, "idle": 30_000.0}
    b = within(quiet_then_burst, since=99.9)
    # Spark planned it 80 ms after the burst began (100 ms before on_batch, 20 of them reading);
    # the batch thread waited from the burst's start to taking it at 100.2.
    assert b["spark"] == pytest.approx(80.0) and b["idle"] == pytest.approx(300.0)
    assert within(b, since=50.0) == b  # waits that began after `since` are kept whole
