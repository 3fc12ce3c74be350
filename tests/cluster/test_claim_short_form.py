"""The claim pair's short form on a live pair through a master kill, against replay:
examples/cluster.yaml. The scenario: tests/cluster/claim_flows.py."""

import pytest

from tests.cluster.claim_flows import CASES, run_through_a_master_kill

pytestmark = pytest.mark.cluster


@pytest.mark.flow(text=CASES["short-form"][0])
def test_the_flow_live_through_a_master_kill_matches_replay(cluster):
    run_through_a_master_kill(cluster, "short-form")
