"""Redis Cluster failover under a store: the primary that owns the flow's slot
is SIGKILLed and its replica takes the slot over. A crashed primary answers nothing (no MOVED), so
the store must find the new owner by asking the other cluster nodes on a connection error, and
every store call must have a deadline. The same with two ``twinflow run`` processes:
``tests/cluster/test_redis_cluster_node.py``.

Real redis-server processes in cluster mode (three primaries, one replica each) on 127.0.0.1,
stopped by PID.
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_until
from twinflow.cluster.connect import connect_redis
from twinflow.testing.redis_ha import LocalRedisCluster
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.store_errors import RedisUnavailable
pytestmark = pytest.mark.cluster


@pytest.fixture
def redis_cluster(tmp_path):
    cluster = LocalRedisCluster.start(str(tmp_path / "redis-cluster"), replicas=1, node_timeout_ms=15000)
    yield cluster
    cluster.stop()


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
