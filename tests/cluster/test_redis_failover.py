"""Redis failover under a live flow (issue 18, item 4 and "Redis high availability").

Redis Cluster: the primary that owns the flow's slot is SIGKILLed and its
replica takes the slot over. A crashed primary answers nothing (no MOVED), so
the nodes must find the new owner by asking the other cluster nodes on a
connection error, and every store call must have a deadline. Before that fix
both ``twinflow run`` nodes kept dialling the dead port: the flow stopped for
good (this test timed out waiting for the second half of the messages).

Everything is real: redis-server processes in cluster mode (three primaries,
one replica each) on 127.0.0.1, the session's ZooKeeper, two ``twinflow run``
processes; servers are stopped by PID.
"""

from __future__ import annotations

import time

import pytest
import redis

from tests.cluster.harness import Flow
from tests.conftest import wait_until
from twinflow.chaos.invariants import check_sink, read_sink
from twinflow.cluster.connect import connect_redis
from twinflow.cluster.services import LocalRedisCluster
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_store import FlowKeys, FlowStore, RedisUnavailable

pytestmark = pytest.mark.cluster


@pytest.fixture
def redis_cluster(tmp_path):
    cluster = LocalRedisCluster.start(str(tmp_path / "redis-cluster"), replicas=1, node_timeout_ms=15000)
    yield cluster
    cluster.stop()


def _owner_client(cluster: LocalRedisCluster, key: str) -> redis.Redis:
    return redis.Redis(port=cluster.servers[cluster.owner(key)].port, socket_timeout=5)


def test_a_store_finds_the_new_slot_owner_after_the_primary_crashes_and_gives_up_at_its_deadline(
        redis_cluster, flow_name):
    """In-process, on real servers: the owner SIGKILLed, no failover yet (a long node time-out):
    a call with no deadline of its own gives up at the store's deadline instead of hanging;
    after the replica takes over, the same store answers from the new owner."""
    keys = FlowKeys(flow_name)
    owner = redis_cluster.owner(keys.uplink)
    (replica,) = redis_cluster.replicas_of(owner)
    # Pointed at the owner itself: the URL's node is the one that dies.
    client = connect_redis(redis_cluster.urls[owner], 10, socket_timeout_s=1.0, slot_key=keys.uplink)
    store = FlowStore(client, keys, "node-a", call_deadline_s=1.5)
    store.publish([b'{"id": "a"}'])
    msg = Message("a", None, "1-0", b"{}")
    assert store.processed([msg]) == [False]

    redis_cluster.kill(owner)
    began = time.monotonic()
    with pytest.raises(RedisUnavailable):
        store.processed([msg])  # no deadline given: the store's own
    assert 1.4 <= time.monotonic() - began < 6.0

    redis_cluster.takeover(replica)
    wait_until(lambda: redis_cluster.owner(keys.uplink) == replica, 30, what="the replica to own the slot")
    assert store.processed([msg], deadline_s=10) == [False]
    assert store.r.connection_pool.connection_kwargs["port"] == redis_cluster.servers[replica].port
    assert store.ping()


def test_the_flow_goes_on_after_the_slot_owner_crashes_and_its_replica_takes_over(
        redis_cluster, services, flow_name, tmp_path):
    """Cross-process: two nodes pointed at the primary that owns the flow's slot; it is
    SIGKILLed by PID and its replica takes over (CLUSTER FAILOVER TAKEOVER); every message
    published before and after leaves the flow exactly once, within a deadline."""
    keys = FlowKeys(flow_name)
    owner = redis_cluster.owner(keys.uplink)
    (replica,) = redis_cluster.replicas_of(owner)
    on_owner = type("Svc", (), {"redis_url": redis_cluster.urls[owner], "zk_hosts": services.zk_hosts})()
    flow = Flow(tmp_path, flow_name, on_owner, bake_time=2.0)
    try:
        flow.node("a")
        flow.wait_status("a", role="master")
        flow.node("b")
        flow.wait_status("b", role="worker", streaming=1)
        flow.publish(300)
        flow.r.execute_command("WAIT", 1, 5000)  # the uplink entries are on the replica
        wait_until(lambda: len(flow.sink_ids()) >= 300, 60, what="the first 300 messages in the sink")

        redis_cluster.kill(owner)
        redis_cluster.takeover(replica)
        wait_until(lambda: redis_cluster.owner(keys.uplink) == replica, 30, what="the replica to own the slot")
        failed_over = time.monotonic()
        flow.r = _owner_client(redis_cluster, keys.uplink)  # the test's own client moves too
        flow.publish(300)

        def done():
            return set(flow.sent) <= set(flow.sink_ids())
        try:
            wait_until(done, 60, interval_s=0.2, what="all 600 messages in the sink after the failover")
        except AssertionError:
            print(flow.logs())
            raise
        report = check_sink(read_sink(flow.r, flow.key("sink")), flow.sent)
        assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report
        assert time.monotonic() - failed_over < 60
        # Both nodes live on, and one of them is master on the new owner.
        assert flow.nodes["a"].alive() and flow.nodes["b"].alive(), flow.logs()
        wait_until(lambda: "master" in {flow.status("a").get("role"), flow.status("b").get("role")}, 30,
                   what="a master after the failover")
    finally:
        flow.stop_all()
