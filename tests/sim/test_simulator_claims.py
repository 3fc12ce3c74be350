"""The simulator drives the claim pair's rulesets (kind ``rulesets``: two baking groups with their
own keys and claim IDs, a claim ruleset, nohit traffic) and catches a claim taken in the wrong
group: Redis, the record, keeps such a break from losing a message, so the simulator checks the
claims themselves (``Schedule._check_claims_released``)."""

from __future__ import annotations

from tests.sim.planted import caught
from twinflow.chaos.sim.simulator import run_once
from twinflow.runtime.nodes.sort import ClaimSortNode


def test_the_rulesets_kind_passes():
    result = run_once(3, kind="rulesets")
    assert result.passed, result.problems
    assert result.sent > 0 and result.lost == 0


def test_a_claim_taken_in_the_wrong_rulesets_group_is_caught(monkeypatch):
    real = ClaimSortNode.take_claims

    def in_the_next_group(self, claims):
        names = list(self.bake_times)
        moved = [(cid, key, pos, names[(names.index(rule) + 1) % len(names)] if rule in names else rule)
                 for cid, key, pos, rule in claims]
        return real(self, moved)

    monkeypatch.setattr(ClaimSortNode, "take_claims", in_the_next_group)
    failed = caught(monkeypatch, (3,), ("left their processed messages held",),  # the first of seeds 1-150
                    kind="rulesets")
    assert failed.trace
