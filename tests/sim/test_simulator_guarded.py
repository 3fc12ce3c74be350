"""The simulator drives a handler guarded by the history (kind ``guarded``,
examples/cluster-guarded.yaml): masters killed inside handler calls, the ledger going down (retries,
then a suspension every peer holds for), operators asking to resume. Runs keep every promise and
the ledger's (every order booked once, no call repeated outside an In Doubt decision, no second
copy of an order dropped as a Duplicate while its first run was under way), with orders the ledger
refuses audited FAILED and resubmitted by an operator; and a history that takes a dead master's
"processing" entry for a run in progress, that calls a second copy of a run in progress a Duplicate
without asking the resolver, or that runs it again without asking, or an action that runs a doubted
attempt again without asking, or takes a resubmit unguarded, is caught."""

from __future__ import annotations

from tests.sim import planted
from twinflow.chaos.sim.simulator import run_once
from twinflow.runtime.nodes.history import DUPLICATE, IN_PROGRESS, HistoryNode
from twinflow.runtime.nodes.action import ActionNode

RUNS = 12


def test_guarded_runs_keep_every_promise_and_the_ledger():
    results = [run_once(seed, kind="guarded") for seed in range(1, RUNS + 1)]
    assert [r.seed for r in results if not r.passed] == [], [r.problems for r in results if not r.passed]
    total = sum((r.counts for r in results), start=results[0].counts.__class__())
    # What the kind is for did happen: kills inside handlers decided by the resolver, both ways;
    # second copies of an order that came while its first run waited for the ledger, asked about;
    # the ledger down (retries, suspensions) and resumes asked for.
    assert total["handler_kills"] >= 5 and total["in_doubt_run_again"] >= 5 and total["in_doubt_duplicate"] >= 5
    assert total["in_doubt_in_progress"] >= 3
    assert total["ledger_downs"] >= 5 and total["resumes_requested"] >= 5
    # Orders the ledger refused, audited FAILED and resubmitted: each left once more, no more.
    assert total["resubmitted"] >= 5 and total["left_again_resubmitted"] >= 5


def caught(monkeypatch, kind_of_problem: str, seeds=range(1, RUNS + 1)) -> None:
    """The planted bug fails a guarded run naming ``kind_of_problem``; that seed passes without it."""
    planted.caught(monkeypatch, seeds, (kind_of_problem,), kind="guarded")


def test_a_history_that_loads_a_dead_masters_processing_entry_as_a_run_in_progress_is_caught(monkeypatch):
    load_state = HistoryNode.load_state

    def trusts_it(self, entries):
        load_state(self, entries)
        self._doubted.clear()  # as if the run were still under way downstream: a Duplicate, never run

    monkeypatch.setattr(HistoryNode, "load_state", trusts_it)
    caught(monkeypatch, "never booked", seeds=(1,))  # the first of seeds 1-12


def test_a_history_that_calls_a_run_in_progress_a_duplicate_without_asking_is_caught(monkeypatch):
    doubt = HistoryNode._doubt

    def as_before(self, msg, uuid, reason, started, now):
        if reason == IN_PROGRESS:  # a Duplicate, the resolver never told
            return self._verdict(DUPLICATE, msg, uuid, {"reason": reason})
        return doubt(self, msg, uuid, reason, started, now)

    monkeypatch.setattr(HistoryNode, "_doubt", as_before)
    caught(monkeypatch, "the resolver was never asked", seeds=(4,))  # the first of seeds 1-12


def test_a_history_that_runs_a_run_in_progress_again_without_asking_is_caught(monkeypatch):
    doubt = HistoryNode._doubt

    def runs_it(self, msg, uuid, reason, started, now):
        if reason == IN_PROGRESS:  # the handler called a second time while the first run goes on
            return self._run(msg, (self.trigger, uuid), now, {"reason": reason})
        return doubt(self, msg, uuid, reason, started, now)

    monkeypatch.setattr(HistoryNode, "_doubt", runs_it)
    caught(monkeypatch, "the ledger:", seeds=(4,))  # the first of seeds 1-12


def test_an_action_that_takes_a_resubmit_unguarded_is_caught(monkeypatch):
    # As the audit's first resubmits did: straight to the handler, no marker before the call.
    monkeypatch.setattr(ActionNode, "on_resubmit", lambda self, msg, now, token: self.on_message(msg, now))
    caught(monkeypatch, "the ledger:", seeds=(22, 24))  # the first two seeds of 1-400 that show it


def test_an_action_that_runs_a_doubted_attempt_again_without_asking_is_caught(monkeypatch):
    guarded = ActionNode._guarded

    def never_asks(self, msg, retries, now, order):
        self._doubted.discard(order)
        return guarded(self, msg, retries, now, order)

    monkeypatch.setattr(ActionNode, "_guarded", never_asks)
    caught(monkeypatch, "the ledger:", seeds=(20, 33))  # the first two seeds of 1-400 that show it
