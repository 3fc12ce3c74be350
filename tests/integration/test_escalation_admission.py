"""A worker checks escalations instead of trusting them.

A real worker peer (its store on the session's Redis, its leadership on the
session's ZooKeeper, its gRPC server on loopback; no Spark: its batches are
handed to ``on_batch`` by the test) bakes messages nobody processed. Batches
forged in another process, with a huge epoch, from a peer that is not the
master, or even in the master's own name and epoch, release nothing: the
first two are refused with their reason and counted, the last is accepted
but its claims are only hints, and Redis shows none of its messages
processed. Once the master has processed them (their IDs in the ID cache),
its escalation releases them.
"""

import json
import subprocess
import sys

import pytest

from tests.conftest import wait_until
from twinflow.client import EscalationClient
from twinflow.cluster.connect import connect_zookeeper
from twinflow.cluster.peer import Peer
from twinflow.cluster.peer_config import PeerConfig
from twinflow.cluster.real_parts import RealParts
from twinflow.runtime.flowgraph import parse_graph

FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
message: {{id: id}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
  claims: {{type: sort, pairs_with: deliver, key: seq, bake_time: 600}}
cluster: {{redis_checks: warn}}
"""

FORGE = """
import json, sys
from twinflow.client import EscalationClient
address, flow, from_node, epoch, claims = sys.argv[1:6]
with EscalationClient(address, flow, from_node) as client:
    ack = client.send(int(epoch), [tuple(c) for c in json.loads(claims)])
print(json.dumps({"accepted": ack.accepted, "claimed": ack.claimed, "reason": ack.reason}))
"""


class NoSpark(RealParts):
    """Real Redis, ZooKeeper and gRPC; the uplink's batches come from the test."""

    class Reading:
        isActive = True

        def exception(self):
            return None

        def hold(self, member, held):
            pass

        def pace(self, member, interval_ms, behind_ms=0):
            pass

        def stop(self):
            pass

    def engine(self, peer):
        pass

    def reading(self, peer, starts):
        return self.Reading()


def forge(address, flow, from_node, epoch, claims):
    """Send one escalation batch from another process; its ack as a dict."""
    done = subprocess.run([sys.executable, "-c", FORGE, address, flow, from_node, str(epoch), json.dumps(claims)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def worker(redis_url, zk_hosts, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    peer = Peer.for_flow(graph, PeerConfig(peer_id="w", redis_url=redis_url, zk_hosts=zk_hosts,
                                           state_dir=str(tmp_path)), parts=NoSpark())
    peer.start()
    zk = connect_zookeeper(zk_hosts, 10.0)
    try:
        yield peer.member, zk
    finally:
        peer.stop()
        zk.stop()
        zk.close()


def test_forged_batches_release_nothing_and_the_masters_claims_do(worker, flow_name):
    member, zk = worker
    # Another peer, "a", takes the master role as Leadership does: it writes the epoch znode.
    epoch = zk.set(f"/twinflow/{flow_name}/epoch", b"a").version
    wait_until(lambda: member.leadership.current_master() == ("a", epoch), 5.0, what="the worker's watch")
    positions = member.store.publish([json.dumps({"id": f"m{i}", "seq": i}).encode() for i in range(3)])
    member.on_batch(1, [(p, json.dumps({"id": f"m{i}", "seq": i}).encode(), None) for i, p in enumerate(positions)])
    assert member.status()["baked"] == 3
    claims = [[f"m{i}", str(i), p] for i, p in enumerate(positions)]

    huge = forge(member.address, flow_name, "a", 10**12, claims)
    assert not huge["accepted"] and "not the master's" in huge["reason"]
    assert member.state.known_epoch <= epoch  # a forged epoch does not raise what the worker accepts

    stranger = forge(member.address, flow_name, "mallory", epoch, claims)
    assert not stranger["accepted"] and "'mallory' is not the master" in stranger["reason"]

    # In the master's name and epoch: accepted, but nothing it claims was processed.
    posing = forge(member.address, flow_name, "a", epoch, claims)
    assert posing == {"accepted": True, "claimed": 0, "reason": ""}
    status = member.status()
    assert status["baked"] == 3 and status["claimed"] == 0
    assert status["claims_unproven"] == 3 and status["escalations_refused"] == 2

    # The master processes m0 and m1 (the ID cache is the record), then escalates all three.
    for i in (0, 1):
        member.store.r.set(member.keys.id_prefix + f"m{i}", epoch)
    with EscalationClient(member.address, flow_name, "a") as master:
        ack = master.send(epoch, [tuple(c) for c in claims])
    assert ack.accepted and ack.claimed == 2
    status = member.status()
    assert status["baked"] == 1 and status["claimed"] == 2  # m2 bakes on until proven

    # A promotion elsewhere: the old master's batches are refused from now on.
    newer = zk.set(f"/twinflow/{flow_name}/epoch", b"b").version
    late = forge(member.address, flow_name, "a", epoch, claims[2:])
    assert not late["accepted"]
    wait_until(lambda: member.leadership.current_master() == ("b", newer), 5.0, what="the watch to see b")
