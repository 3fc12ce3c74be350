"""Two ``twinflow run`` peers on a real Redis Cluster (three primaries on loopback, a replica each),
pointed at a node that does not own the flow's slot: they find the owner, run the chained flow
(history -> AND join -> action, with the claim pair), fail over, and every message leaves the flow
exactly once. Then the primary that owns the flow's slot is SIGKILLed and its replica takes over
(``CLUSTER FAILOVER TAKEOVER``): a crashed primary answers nothing, not MOVED, so peers that kept
dialling its port would stop the flow for good; they ask the cluster nodes they know who owns the
slot, and the flow goes on."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import redis

from tests.cluster.harness import cluster_on
from tests.conftest import settled, wait_until
from tests.integration.test_redis_cluster import owner_and_other
from twinflow.testing.checker import check_outputs, read_outputs
from twinflow.testing.messages import CHAINED, order_or_payment
from twinflow.cluster.master_flow import outlink_streams
from twinflow.testing.redis_ha import LocalRedisCluster
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.store.flow_keys import FlowKeys
pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(tmp_path, services, flow_name):
    redis_cluster = LocalRedisCluster.start(str(tmp_path / "redis-cluster"), replicas=1, node_timeout_ms=15000)
    owner, other = owner_and_other(redis_cluster, f"tf:{{{flow_name}}}:uplink")
    # The test reads and writes on the owner; the peers are given another node's address.
    on_owner = SimpleNamespace(redis_url=f"redis://127.0.0.1:{owner}/0", zk_hosts=services.zk_hosts)
    # Join time-out 2 s, so that time-outs fire on both masters.
    c = cluster_on(on_owner, tmp_path, flow_name, text=CHAINED.read_text().replace("timeout: 10 ", "timeout: 2 "))
    c.other_url = f"redis://127.0.0.1:{other}/0"
    c.redis_cluster = redis_cluster
    yield c
    c.stop()
    redis_cluster.stop()


def test_the_chained_flow_on_a_redis_cluster_fails_over_and_loses_nothing(cluster):
    streams = outlink_streams(load_graph(cluster.flow_path), FlowKeys(cluster.flow))
    sent: list[str] = []

    def publish(first: int, n: int) -> None:
        docs = [order_or_payment(i) for i in range(first, first + n)]
        cluster.publish(docs)
        sent.extend(dict.fromkeys(d["id"] for d in docs))

    cluster.peer("a", redis_url=cluster.other_url)
    cluster.wait_status("a", role="master")
    cluster.peer("b", redis_url=cluster.other_url)
    cluster.wait_status("b", role="worker", streaming=1)
    publish(0, 400)
    wait_until(lambda: len(read_outputs(cluster.redis, streams).get("deliver.done", [])) >= 50, 30,
               what="the first joined pairs")
    os.killpg(cluster.peers["a"].pid, signal.SIGKILL)
    cluster.wait_status("b", role="master", timeout_s=30)
    publish(400, 400)

    def report():
        r = check_outputs(read_outputs(cluster.redis, streams), sent)
        return r if r.lost == 0 else None
    wait_until(report, 60, interval_s=0.25, what=f"all {len(sent)} messages out of the flow")
    result = settled(lambda: check_outputs(read_outputs(cluster.redis, streams), sent))
    assert result.lost == 0 and result.duplicated == 0, result
    outputs = read_outputs(cluster.redis, streams)
    # Joined on both masters, and the lone orders' time-outs fired too.
    assert {e.peer for e in outputs["deliver.done"]} == {"a", "b"}
    assert outputs.get("match.expired") and outputs.get("guard.duplicate")

    # The slot owner crashes; its replica takes the slot over.
    rc, key = cluster.redis_cluster, FlowKeys(cluster.flow).uplink
    dead = rc.owner(key)
    (replica,) = rc.replicas_of(dead)
    cluster.redis.execute_command("WAIT", 1, 5000)  # everything so far is on the replica
    rc.kill(dead)
    rc.takeover(replica)
    wait_until(lambda: rc.owner(key) == replica, 30, what="the replica to own the flow's slot")
    cluster.redis = cluster.producer = redis.Redis(port=rc.servers[replica].port, socket_timeout=5)
    publish(800, 400)
    try:
        wait_until(report, 60, interval_s=0.25, what=f"all {len(sent)} messages out after the Redis failover")
    except AssertionError:
        print(cluster.logs())
        raise
    result = settled(lambda: check_outputs(read_outputs(cluster.redis, streams), sent))
    assert result.lost == 0 and result.duplicated == 0 and result.unexpected == 0, result
    assert cluster.peers["b"].alive(), cluster.logs()
