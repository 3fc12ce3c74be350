"""A flow node driven without Spark or ZooKeeper: its collaborators are passed in (node_parts).

The store is real (the session's redis-server); the stream, the leadership,
the escalation sender and the gRPC server are small stand-ins the test
drives by hand, as a failover simulator would. Two nodes hand a half-complete
AND join from one master to the next through Redis.
"""

import json

import redis

from twinflow.cluster.node import FlowNode, NodeConfig
from twinflow.cluster.node_parts import RealParts
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_store import FlowStore

FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
message: {{id: id}}
nodes:
  match: {{type: join, types: [order, payment], activation_field: order_id, timeout: 10, links: {{joined: deliver}}}}
  deliver: {{type: action, sink: {{stream: sink}}}}
cluster: {{redis_checks: warn}}
"""


class Leadership:
    def __init__(self):
        self.is_master, self.suspended, self.steps_down = False, False, []

    def start(self):
        pass

    def stop(self):
        pass

    def may_write(self):
        return self.is_master

    def step_down(self, reason):
        self.steps_down.append(reason)
        self.is_master = False

    def members(self):
        return {}


class Stub:
    """Stands in for the ZooKeeper client, the gRPC server, the sender and the stream."""

    isActive = True

    def __init__(self):
        self.sent = []

    def exists(self, path):
        return None

    def send(self, claims):
        self.sent += claims

    def exception(self):
        return None

    def stop(self, *args):
        pass

    def close(self):
        pass


class SimulatedParts(RealParts):
    """A real store on the given Redis; everything else by hand."""

    def __init__(self, redis_url):
        super().__init__()
        self.redis_url, self.leader = redis_url, Leadership()

    def store(self, node):
        return FlowStore(redis.Redis.from_url(self.redis_url), node.keys, node.cfg.node_id)

    def zookeeper(self, node):
        return Stub()

    def prepare_stream(self, node):
        pass

    def server(self, node):
        return Stub(), 0

    def sender(self, node):
        return Stub()

    def leadership(self, node):
        return self.leader

    def stream(self, node, start):
        return Stub()

    def hold(self, stream, held):
        pass

    def pace(self, stream, interval_ms):
        pass

    def stop_stream(self, stream):
        pass


def node(graph, node_id, redis_url, clock, tmp_path):
    cfg = NodeConfig(node_id=node_id, redis_url=redis_url, zk_hosts="unused", state_dir=str(tmp_path / node_id),
                     start_from="processed")
    n = FlowNode(graph, cfg, clock=clock, parts=SimulatedParts(redis_url))
    n.start()
    n.streaming = True
    return n


def test_two_simulated_nodes_hand_a_pending_join_over_through_redis(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    a, b = node(graph, "a", redis_url, clock, tmp_path), node(graph, "b", redis_url, clock, tmp_path)
    try:
        up = a.keys.uplink
        r = a.store.r
        order = r.xadd(up, {"data": json.dumps({"id": "o1", "type": "order", "order_id": 1})}).decode()
        a.parts.leader.is_master = True
        a.on_promoted(1)
        a.on_batch(0, [(order, r.xrange(up)[0][1][b"data"], None)])
        assert a.status()["pending"] == 1 and r.hlen(a.keys.state("match")) == 1

        # a dies; b is promoted at a newer epoch and finds the open group in Redis.
        b.parts.leader.is_master = True
        b.on_promoted(2)
        assert b.status()["pending"] == 1
        clock.advance(1.0)
        payment = r.xadd(up, {"data": json.dumps({"id": "p1", "type": "payment", "order_id": 1})}).decode()
        b.on_batch(0, [(payment, r.xrange(up)[-1][1][b"data"], None)])
        assert [f[b"id"] for _, f in r.xrange(a.keys.sink)] == [b"o1+p1"]
        assert b.status()["pending"] == 0 and r.hlen(a.keys.state("match")) == 0

        # The old master, still believing it leads, is fenced: its step changes nothing.
        late = r.xadd(up, {"data": json.dumps({"id": "o2", "type": "order", "order_id": 2})}).decode()
        a.on_batch(1, [(late, r.xrange(up)[-1][1][b"data"], None)])
        assert a.parts.leader.steps_down == ["fenced"] and r.hlen(a.keys.state("match")) == 0
    finally:
        a.stop()
        b.stop()


def test_a_repeated_id_in_a_later_chunk_of_the_same_batch_runs_once(redis_url, flow_name, tmp_path):
    flow = FLOW.format(name=flow_name).replace("input: match", "") + "input: deliver\n"
    graph = parse_graph(flow)
    n = node(graph, "a", redis_url, FakeClock(1000.0), tmp_path)
    try:
        r = n.store.r
        pipe = r.pipeline()
        for i in range(1001):  # a step holds at most 1,000 messages: the last one is in a second step
            pipe.xadd(n.keys.uplink, {"data": json.dumps({"id": "same" if i in (0, 1000) else f"m{i}"})})
        pipe.execute()
        rows = [(eid.decode(), f[b"data"], None) for eid, f in r.xrange(n.keys.uplink)]
        n.parts.leader.is_master = True
        n.on_promoted(1)
        n.on_batch(0, rows)
        ids = [f[b"id"] for _, f in r.xrange(n.keys.sink)]
        assert len(ids) == 1000 and ids.count(b"same") == 1
    finally:
        n.stop()
