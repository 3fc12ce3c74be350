"""The simulator drives a master's timer rounds through their faults (``Dims.timer_faults``):
a master's flow dropped as a step that failed leaves it, and the reader's pace failing. Runs
with them keep every promise, and a master that left a dropped flow's deadlines for its next
batch is caught: after the last batch, the chained flow's lone orders never leave by their
time-out (what one rolling restart between hosts showed, chaos/RESULTS.md)."""

from __future__ import annotations

from tests.sim.planted import caught
from twinflow.chaos.sim.simulator import run_once
from twinflow.cluster.master_side import MasterSide

RUNS = 20
FAULTS = {"timer_faults": 0.3}


def test_runs_with_timer_faults_keep_every_promise():
    results = [run_once(seed, kind="chained", only=FAULTS) for seed in range(1, RUNS + 1)]
    assert [r.seed for r in results if not r.passed] == [], [r.problems for r in results if not r.passed]
    assert sum(r.counts["timer_faults"] for r in results) >= RUNS  # the faults did happen


def test_a_master_that_fires_a_dropped_flows_deadlines_only_with_a_batch_is_caught(monkeypatch):
    fire_due = MasterSide.fire_due

    def waits_for_a_batch(self, now):  # as the master's timer did: no flow, no deadline
        if self.flow is None and self.remote_batch_at == float("-inf"):
            return self.remote_deadline
        return fire_due(self, now)

    monkeypatch.setattr(MasterSide, "fire_due", waits_for_a_batch)
    caught(monkeypatch, (3,), ("never left the flow",), kind="chained", only=FAULTS)  # the first of seeds 1-20


def test_a_sharded_master_that_trusts_the_executors_deadline_after_its_own_flow_was_dropped_is_caught(monkeypatch):
    # A sharded master whose own flow (loaded for a batch handed back, or to fire) was dropped
    # after an executor had run a batch: the executor's next deadline is older than that flow's.
    fire_due = MasterSide.fire_due

    def trusts_the_executors(self, now):
        if self.flow is None and self.remote_batch_at != float("-inf"):
            due = self.remote_deadline
            if due is None or due > now:
                return due
        return fire_due(self, now)

    monkeypatch.setattr(MasterSide, "fire_due", trusts_the_executors)
    caught(monkeypatch, (194, 689), ("never left the flow",), kind="sharded")  # the first two of 2,000 seeds
