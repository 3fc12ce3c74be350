"""A flow on a real Redis Cluster (three primaries): every key of a flow in one slot, the store
connected to the slot's owner whichever node it was pointed at, and MOVED followed."""

import json

import pytest
import redis

from twinflow.cluster.connect import connect_redis
from twinflow.cluster.master_flow import MasterFlow
from twinflow.testing.redis_ha import LocalRedisCluster
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
nodes:
  match: {{type: join, types: [order, payment], activation_field: order_id, timeout: 10, links: {{joined: deliver}}}}
  deliver: {{type: action, sink: {{stream: sink}}}}
"""


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    cluster = LocalRedisCluster.start(str(tmp_path_factory.mktemp("redis-cluster")))
    yield cluster
    cluster.stop()


def owner_and_other(cluster: LocalRedisCluster, key: str) -> tuple[int, int]:
    """The port of the node that owns ``key``'s slot, and of one that does not."""
    any_node = redis.Redis.from_url(cluster.urls[0])
    slot = any_node.execute_command("CLUSTER KEYSLOT", key)
    for first, last, primary, *_ in any_node.execute_command("CLUSTER SLOTS"):
        if first <= slot <= last:
            owner = int(primary[1])
    return owner, next(s.port for s in cluster.servers if s.port != owner)


def test_a_store_pointed_at_any_node_works_on_the_slots_owner(redis_cluster, flow_name):
    graph = parse_graph(FLOW.format(name=flow_name))
    keys = FlowKeys(flow_name, "uplink", "sink")
    owner, other = owner_and_other(redis_cluster, keys.uplink)
    client = connect_redis(f"redis://127.0.0.1:{other}/0", 10, slot_key=keys.uplink)
    assert client.connection_pool.connection_kwargs["port"] == owner
    store = FlowStore(client, keys, "node-a")
    assert store.config_problems() == []
    store.raise_epoch(1)
    flow = MasterFlow.load(graph, store)
    for n, doc in enumerate([{"id": "o1", "type": "order", "order_id": 1},
                             {"id": "p1", "type": "payment", "order_id": 1}], 1):
        msg = Message(doc["id"], None, f"{n}-0", json.dumps(doc).encode(), doc)
        assert store.processed([msg]) == [False]  # a pipeline with MGET: refused by a cluster client
        store.commit(1, flow.run([msg], now=float(n), epoch=1))
    owner_node = redis.Redis(port=owner)
    assert [f[b"id"] for _, f in owner_node.xrange(keys.sink)] == [b"o1+p1"]
    assert owner_node.get(keys.processed) == b"2-0" and owner_node.exists(keys.id_prefix + "p1")


def test_a_store_on_the_wrong_node_follows_moved(redis_cluster, flow_name):
    keys = FlowKeys(flow_name)
    owner, other = owner_and_other(redis_cluster, keys.uplink)
    store = FlowStore(redis.Redis(port=other), keys, "node-a")  # as if the slot had moved away
    ids = store.publish([b'{"id": "x"}'])
    assert store.r.connection_pool.connection_kwargs["port"] == owner
    assert redis.Redis(port=owner).xlen(keys.uplink) == 1 and len(ids) == 1
