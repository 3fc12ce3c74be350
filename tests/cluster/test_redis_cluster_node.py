"""Two ``twinflow run`` nodes on a real Redis Cluster (three primaries on loopback), pointed at a
node that does not own the flow's slot: they find the owner, run the chained flow (history -> AND
join -> action, with the claim pair), fail over, and every message leaves the flow exactly once."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from tests.cluster.harness import Flow
from tests.conftest import wait_until
from tests.integration.test_redis_cluster import owner_and_other
from twinflow.chaos.invariants import check_outputs, read_outputs
from twinflow.cluster.demo import CHAINED, order_or_payment
from twinflow.cluster.master_flow import outlink_streams
from twinflow.cluster.services import LocalRedisCluster
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.store.flow_store import FlowKeys

pytestmark = pytest.mark.cluster


@pytest.fixture
def flow(tmp_path, services, flow_name):
    cluster = LocalRedisCluster.start(str(tmp_path / "redis-cluster"))
    owner, other = owner_and_other(cluster, f"tf:{{{flow_name}}}:uplink")
    # The test reads and writes on the owner; the nodes are given another node's address.
    on_owner = SimpleNamespace(redis_url=f"redis://127.0.0.1:{owner}/0", zk_hosts=services.zk_hosts)
    # Join time-out 2 s, so that time-outs fire on both masters.
    f = Flow(tmp_path, flow_name, on_owner, text=CHAINED.read_text().replace("timeout: 10 ", "timeout: 2 "))
    f.other_url = f"redis://127.0.0.1:{other}/0"
    yield f
    f.stop_all()
    cluster.stop()


def test_the_chained_flow_on_a_redis_cluster_fails_over_and_loses_nothing(flow):
    streams = outlink_streams(load_graph(flow.path), FlowKeys(flow.name))
    sent: list[str] = []

    def publish(first: int, n: int) -> None:
        docs = [order_or_payment(i) for i in range(first, first + n)]
        flow.publish_docs(docs)
        sent.extend(dict.fromkeys(d["id"] for d in docs))

    flow.node("a", redis_url=flow.other_url)
    flow.wait_status("a", role="master")
    flow.node("b", redis_url=flow.other_url)
    flow.wait_status("b", role="worker", streaming=1)
    publish(0, 400)
    wait_until(lambda: len(read_outputs(flow.r, streams).get("deliver.done", [])) >= 50, 30,
               what="the first joined pairs")
    os.killpg(flow.nodes["a"].pid, signal.SIGKILL)
    flow.wait_status("b", role="master", timeout_s=30)
    publish(400, 400)

    def report():
        r = check_outputs(read_outputs(flow.r, streams), sent)
        return r if r.lost == 0 else None
    result = wait_until(report, 60, interval_s=0.25, what=f"all {len(sent)} messages out of the flow")
    assert result.duplicated == 0, result
    outputs = read_outputs(flow.r, streams)
    # Joined on both masters, and the lone orders' time-outs fired too.
    assert {e.node for e in outputs["deliver.done"]} == {"a", "b"}
    assert outputs.get("match.expired") and outputs.get("guard.duplicate")
