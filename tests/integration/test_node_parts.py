"""A peer and its member driven without Spark or ZooKeeper: their collaborators are passed in (cluster.collaborators).

The store is real (the session's redis-server); the stream, the leadership,
the escalation sender and the gRPC server are small stand-ins the test
drives by hand, as a failover simulator would. Two peers hand a half-complete
AND join from one master to the next through Redis; a master's batch runs
ahead of Spark, and a peer that dies with it half done delivers it when
promoted again.
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from twinflow.cluster.peer import Peer
from twinflow.cluster.peer_config import PeerConfig
from twinflow.cluster.real_parts import RealParts
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
        self.elected_at, self.previous_master = None, None  # what a promotion's record reads

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

    def target_ids(self):
        return []

    def send(self, claims, read_upto=None):
        self.sent += claims

    def exception(self):
        return None

    def hold(self, member, held):
        pass

    def pace(self, member, interval_ms, behind_ms=0):
        pass

    def stop(self, *args):
        pass

    def close(self):
        pass


class SimulatedParts(RealParts):
    """A real store on the given Redis; everything else by hand."""

    def __init__(self, redis_url):
        super().__init__()
        self.redis_url, self.leader = redis_url, Leadership()

    def store(self, member):
        return FlowStore(redis.Redis.from_url(self.redis_url), member.keys, member.cfg.peer_id)

    def zookeeper(self, peer):
        return Stub()

    def engine(self, peer):
        pass

    def server(self, peer):
        return Stub(), 0

    def reading(self, peer, starts):
        self.peer = peer  # so that a test stops the peer its member belongs to
        return Stub()

    def sender(self, member):
        return Stub()

    def leadership(self, member):
        return self.leader

    def batches_ahead(self):
        return None  # each batch runs in on_batch, so a test sees its effect when it returns


class AheadParts(SimulatedParts):
    """As SimulatedParts, with a master's batches running ahead as in a real peer."""

    def batches_ahead(self):
        return ThreadPoolExecutor(max_workers=1)


def node(graph, peer_id, redis_url, clock, tmp_path, parts=SimulatedParts, **settings):
    cfg = PeerConfig(peer_id=peer_id, redis_url=redis_url, zk_hosts="unused", state_dir=str(tmp_path / peer_id),
                     start_from="processed", **settings)
    peer = Peer.for_flow(graph, cfg, clock=clock, parts=parts(redis_url))
    peer.start()
    n = peer.member
    n.warmed()
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
        a.parts.peer.stop()
        b.parts.peer.stop()


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
        n.parts.peer.stop()


def returns_within(call, timeout_s=10.0) -> bool:
    done = threading.Event()

    def run():
        call()
        done.set()
    threading.Thread(target=run, daemon=True).start()
    return done.wait(timeout_s)


def test_a_worker_that_read_behind_catches_up_to_the_newest_entry_when_promoted(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    a = node(graph, "a", redis_url, FakeClock(1000.0), tmp_path, parts=AheadParts)  # reads 3 s behind
    try:
        r = a.store.r
        for k in range(3):
            for kind in ("order", "payment"):
                r.xadd(a.keys.uplink, {"data": json.dumps({"id": f"{kind[0]}{k}", "type": kind, "order_id": k})})
        newest = r.xrevrange(a.keys.uplink, count=1)[0][0].decode()
        assert a.store.handled_position() is None  # it had read none of them
        a.parts.leader.is_master = True
        a.on_promoted(1)
        # Delivered at promotion, not left for its reader's next batch.
        assert a.store.processed_mark() == newest and a.status()["rolled_back"] == 6
    finally:
        a.stop_member()


def test_a_node_that_dies_with_a_batch_running_ahead_delivers_it_when_promoted(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    # A member that read every entry as it came (no read-behind): promoted, it catches up to where
    # it had read, and the batch it is handed after runs ahead. (One that read behind would catch
    # up to the uplink's newest entry on promotion, and run these entries there.)
    a = node(graph, "a", redis_url, clock, tmp_path, parts=AheadParts, worker_read_behind_ms=0)
    again = None
    gate = threading.Event()
    try:
        r = a.store.r
        for k in range(3):
            for kind in ("order", "payment"):
                r.xadd(a.keys.uplink, {"data": json.dumps({"id": f"{kind[0]}{k}", "type": kind, "order_id": k})})
        rows = [(eid.decode(), f[b"data"], None) for eid, f in r.xrange(a.keys.uplink)]
        a.parts.leader.is_master = True
        a.on_promoted(1)
        commit = a.store.commit

        def stuck_commit(*args, **kwargs):  # the process "dies" with its COMMIT not yet sent
            gate.wait(30)
            return commit(*args, **kwargs)
        a.store.commit = stuck_commit
        # on_batch returns with the batch still running: Spark would now commit it ...
        assert returns_within(lambda: a.on_batch(0, rows))
        # ... which is safe because this member's handled_id already covers it.
        assert a.store.handled_position() == rows[-1][0] and a.store.processed_mark() is None

        # The same peer comes back (a new process, same state) and is promoted at a newer epoch.
        again = node(graph, "a", redis_url, clock, tmp_path, parts=AheadParts, worker_read_behind_ms=0)
        again.parts.leader.is_master = True
        again.on_promoted(2)
        assert sorted(f[b"id"] for _, f in r.xrange(a.keys.sink)) == [b"o0+p0", b"o1+p1", b"o2+p2"]
        assert again.status()["rolled_back"] == 6

        # The stuck COMMIT of the dead incarnation is fenced: nothing is written twice.
        gate.set()
        a.intake.settle_ahead(timeout_s=30)
        assert a.parts.leader.steps_down == ["fenced"] and r.xlen(a.keys.sink) == 3
    finally:
        gate.set()
        a.parts.peer.stop()
        if again is not None:
            again.parts.peer.stop()


def test_a_batch_that_fails_running_ahead_fails_the_next_and_stops_the_node(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    a = node(graph, "a", redis_url, FakeClock(1000.0), tmp_path, parts=AheadParts)
    try:
        r = a.store.r
        r.xadd(a.keys.uplink, {"data": json.dumps({"id": "o1", "type": "order", "order_id": 1})})
        rows = [(eid.decode(), f[b"data"], None) for eid, f in r.xrange(a.keys.uplink)]
        a.parts.leader.is_master = True
        a.on_promoted(1)

        def broken(*args, **kwargs):
            raise RuntimeError("a bug in the step")
        a.store.commit = broken
        a.on_batch(0, rows)
        with pytest.raises(RuntimeError, match="a bug in the step"):
            a.on_batch(1, rows)  # Spark fails this batch: it commits nothing more
        assert isinstance(a.batch_error, RuntimeError)  # run_until_stopped stops the peer on it
    finally:
        a.parts.peer.stop()
