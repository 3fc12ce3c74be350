"""Two ``twinflow run`` nodes on a real Redis Cluster, pointed at a node that does not own the
flow's slot: they find the owner, run the flow, fail over, and lose nothing."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from tests.cluster.harness import Flow
from tests.conftest import wait_until
from tests.integration.test_redis_cluster import owner_and_other
from twinflow.chaos.invariants import check_sink, read_sink
from twinflow.cluster.services import LocalRedisCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def flow(tmp_path, services, flow_name):
    cluster = LocalRedisCluster.start(str(tmp_path / "redis-cluster"))
    owner, other = owner_and_other(cluster, f"tf:{{{flow_name}}}:uplink")
    # The test reads and writes on the owner; the nodes are given another node's address.
    on_owner = SimpleNamespace(redis_url=f"redis://127.0.0.1:{owner}/0", zk_hosts=services.zk_hosts)
    f = Flow(tmp_path, flow_name, on_owner)
    f.other_url = f"redis://127.0.0.1:{other}/0"
    yield f
    f.stop_all()
    cluster.stop()


def test_a_pair_on_a_redis_cluster_fails_over_and_loses_nothing(flow):
    flow.node("a", redis_url=flow.other_url)
    flow.wait_status("a", role="master")
    flow.node("b", redis_url=flow.other_url)
    flow.wait_status("b", role="worker", streaming=1)
    flow.publish(200)
    wait_until(lambda: len(flow.sink_ids()) >= 100, 30, what="the first deliveries")
    os.killpg(flow.nodes["a"].pid, signal.SIGKILL)
    flow.wait_status("b", role="master", timeout_s=30)
    flow.publish(200)
    report = flow.wait_delivered()
    assert report.exactly_once, report
    entries = read_sink(flow.r, flow.key("sink"))
    assert {e.node for e in entries} == {"a", "b"} and check_sink(entries, flow.sent).exactly_once
