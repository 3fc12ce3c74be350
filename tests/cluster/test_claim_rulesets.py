"""The seed's whole claim mode on a live pair through a master kill, against replay:
examples/cluster-claim-rulesets.yaml (two baking groups with their own keys and claim IDs, a claim
ruleset and nohit traffic), its keys read as floats: payments keyed by time stamps, with no ``id``,
claim by the key's text. The scenario: tests/cluster/claim_flows.py."""

import pytest

from tests.cluster.claim_flows import CASES, run_through_a_master_kill

pytestmark = pytest.mark.cluster


@pytest.mark.flow(text=CASES["rulesets"][0])
def test_the_flow_live_through_a_master_kill_matches_replay(cluster):
    run_through_a_master_kill(cluster, "rulesets")
