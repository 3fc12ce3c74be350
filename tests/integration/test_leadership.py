"""Leader election against a real ZooKeeper, across processes.

A child process holds the master role; it is killed with SIGKILL and this
process must be promoted once the child's session expires, with a higher
epoch. A graceful handover between two sessions must not wait for expiry.

Membership must stay complete (a fast restart, a deleted member znode, a
lost session), and the election must always have a candidate: it survives a
failing promotion and only queues a peer while the peer says it may contend.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from kazoo.client import KazooClient

from twinflow.cluster.connect import connect_zookeeper
from twinflow.cluster.leadership import Leadership
from twinflow.cluster.membership import MembersUnknown
from tests.conftest import wait_until

CHILD = textwrap.dedent("""
    import sys, threading
    from twinflow.cluster.connect import connect_zookeeper
    from twinflow.cluster.leadership import Leadership
    zk = connect_zookeeper(sys.argv[1], 10, session_timeout_s=2.0)
    def promoted(epoch):
        print("PROMOTED", epoch, flush=True)
    Leadership(zk, sys.argv[2], "child", "127.0.0.1:1", promoted, lambda r: None).start()
    threading.Event().wait()
""")


# Registers as "n1", then creates an ephemeral probe znode in the same session:
# the probe vanishing tells the parent that this session has expired.
CHILD_MEMBER = textwrap.dedent("""
    import sys, threading
    from twinflow.cluster.connect import connect_zookeeper
    from twinflow.cluster.leadership import Leadership
    zk = connect_zookeeper(sys.argv[1], 10, session_timeout_s=2.0)
    Leadership(zk, sys.argv[2], "n1", "127.0.0.1:1", lambda e: None, lambda r: None).start()
    zk.create(sys.argv[3], b"", ephemeral=True, makepath=True)
    print("READY", zk.client_id[0], flush=True)
    threading.Event().wait()
""")


class Recorder:
    def __init__(self):
        self.events = []

    def promoted(self, epoch):
        self.events.append(("promoted", epoch, time.monotonic()))

    def demoted(self, reason):
        self.events.append(("demoted", reason, time.monotonic()))


def test_sigkill_of_master_promotes_the_other_node_with_a_new_epoch(zk_hosts, flow_name):
    child = subprocess.Popen([sys.executable, "-c", CHILD, zk_hosts, flow_name],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    rec = Recorder()
    me = Leadership(zk, flow_name, "parent", "127.0.0.1:2", rec.promoted, rec.demoted)
    try:
        line = child.stdout.readline().split()
        assert line[0] == "PROMOTED"
        child_epoch = int(line[1])
        me.start()
        wait_until(lambda: set(me.members()) == {"child", "parent"}, 5, what="both members")
        assert me.leader() == "child" and not me.is_master
        os.killpg(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: me.is_master and rec.events, 10, what="promotion")
        kind, epoch, at = rec.events[0]
        assert kind == "promoted" and epoch > child_epoch
        print(f"promoted {at - killed:.2f} s after SIGKILL (2 s session)")
        assert at - killed < 6  # a generous bound: the figure itself is in docs/performance.md
        wait_until(lambda: "child" not in me.members(), 5, what="the dead member to vanish")
    finally:
        child.kill()
        me.stop()
        zk.stop()


def test_handover_moves_the_role_without_session_expiry(zk_hosts, flow_name):
    zks = [connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0) for _ in range(2)]
    recs = [Recorder(), Recorder()]
    peers = [Leadership(z, flow_name, f"n{i}", f"127.0.0.1:{i}", r.promoted, r.demoted)
             for i, (z, r) in enumerate(zip(zks, recs))]
    try:
        peers[0].start()
        wait_until(lambda: peers[0].is_master, 5, what="n0 master")
        assert peers[0].handover(1.0) == {"ok": False, "reason": "no other peer is waiting to take over"}
        peers[1].start()
        wait_until(lambda: len(peers[0].zk.Election(peers[0].paths.election).contenders()) == 2, 5)
        result = peers[0].handover(2.0)
        assert result["ok"] and result["new_master"] == "n1", result
        assert result["seconds"] < 1.0
        wait_until(lambda: peers[1].is_master, 2)
        assert not peers[0].is_master
        assert recs[1].events[0][1] > recs[0].events[0][1]  # a newer epoch
        assert ("demoted", "handover") == recs[0].events[1][:2]
        # the old master queued again and can take the role back
        wait_until(lambda: "n0" in peers[1].zk.Election(peers[1].paths.election).contenders(), 2,
                   what="n0 to queue again")
        result = peers[1].handover(2.0)
        assert result["ok"] and result["new_master"] == "n0"
    finally:
        for n, z in zip(peers, zks):
            n.stop()
            z.stop()


def test_suspended_connection_stops_writes_until_reconnected(zk_hosts, flow_name):
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    me = Leadership(zk, flow_name, "solo", "127.0.0.1:3", lambda e: None, lambda r: None)
    try:
        me.start()
        wait_until(me.may_write, 5)
        me._on_state("SUSPENDED")
        assert me.is_master and not me.may_write()
        me._on_state("CONNECTED")
        assert me.may_write()
    finally:
        me.stop()
        zk.stop()


def _member(zk, flow_name, peer_id):
    """(address, ephemeral owner, czxid) of a member znode, or None when it does not exist."""
    try:
        data, stat = zk.get(f"/twinflow/{flow_name}/members/{peer_id}")
    except Exception:
        return None
    return json.loads(data)["address"], stat.ephemeralOwner, stat.czxid


def _contenders(leadership):
    return leadership.zk.Election(leadership.paths.election).contenders()


def test_restart_within_the_session_timeout_keeps_the_node_a_member(zk_hosts, flow_name):
    probe = f"/twinflow-test/{flow_name}/probe"
    child = subprocess.Popen([sys.executable, "-c", CHILD_MEMBER, zk_hosts, flow_name, probe],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    zk = None
    me = None
    try:
        line = child.stdout.readline().split()
        assert line and line[0] == "READY", line
        old_session = int(line[1])
        os.killpg(child.pid, signal.SIGKILL)
        # The restarted peer: same ID, new session, while the old one still lives.
        zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
        me = Leadership(zk, flow_name, "n1", "127.0.0.1:2", lambda e: None, lambda r: None)
        me.start()
        assert zk.exists(probe) is not None, "the old session expired before the restart: nothing tested"
        assert _member(zk, flow_name, "n1")[:2] == ("127.0.0.1:2", zk.client_id[0])
        wait_until(lambda: zk.exists(probe) is None, 10, what="the killed peer's session to expire")
        member = _member(zk, flow_name, "n1")
        assert member is not None, "the member znode vanished with the old session"
        assert member[:2] == ("127.0.0.1:2", zk.client_id[0]) and member[1] != old_session
        assert me.members() == {"n1": "127.0.0.1:2"}
    finally:
        child.kill()
        child.wait()
        if me is not None:
            me.stop()
        if zk is not None:
            zk.stop()


def test_a_deleted_member_znode_is_created_again(zk_hosts, flow_name):
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    other = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    me = Leadership(zk, flow_name, "n1", "127.0.0.1:7", lambda e: None, lambda r: None)
    try:
        me.start()
        before = _member(zk, flow_name, "n1")
        assert before[:2] == ("127.0.0.1:7", zk.client_id[0])
        other.delete(f"/twinflow/{flow_name}/members/n1")
        after = wait_until(lambda: (m := _member(other, flow_name, "n1")) and m[2] > before[2] and m,
                           5, what="the member znode to be created again")
        assert after[:2] == ("127.0.0.1:7", zk.client_id[0])
        me.stop()
        assert other.exists(f"/twinflow/{flow_name}/members/n1") is None  # stop() removes it for good
    finally:
        me.stop()
        zk.stop()
        other.stop()


def test_a_node_queues_for_the_election_only_while_it_may_contend(zk_hosts, flow_name):
    zks = [connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0) for _ in range(2)]
    gate = {"open": False, "calls": 0}

    def may_contend():
        gate["calls"] += 1
        if gate["calls"] == 3:
            raise RuntimeError("gate broke")  # counts as False; the loop goes on
        return gate["open"]

    master = Leadership(zks[0], flow_name, "a", "127.0.0.1:1", lambda e: None, lambda r: None)
    gated = Leadership(zks[1], flow_name, "b", "127.0.0.1:2", lambda e: None, lambda r: None,
                       may_contend=may_contend)
    try:
        master.start()
        wait_until(lambda: master.is_master, 5, what="a master")
        gated.start()
        wait_until(lambda: gate["calls"] >= 5, 5, what="the gate to be asked 5 times")
        assert _contenders(master) == ["a"]
        assert not gated.is_master
        assert set(master.members()) == {"a", "b"}  # a member (escalations reach it) all the same
        gate["open"] = True
        wait_until(lambda: _contenders(master) == ["a", "b"], 5, what="b to queue")
        assert master.is_master and not gated.is_master
    finally:
        for n, z in zip((master, gated), zks):
            n.stop()
            z.stop()


def test_a_failed_promotion_demotes_and_queues_the_node_again(zk_hosts, flow_name):
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    events = []

    def promoted(epoch):
        events.append(("promoted", epoch))
        if len(events) == 1:
            raise RuntimeError("catch-up failed")

    me = Leadership(zk, flow_name, "solo", "127.0.0.1:3", promoted, lambda r: events.append(("demoted", r)))
    try:
        me.start()
        wait_until(lambda: len(events) >= 3 and me.is_master, 5, what="a second promotion")
        assert events[1] == ("demoted", "promotion failed: catch-up failed")
        assert events[0][0] == events[2][0] == "promoted" and events[2][1] > events[0][1]
        assert me.may_write() and me.leader() == "solo"
        assert len(events) == 3
    finally:
        me.stop()
        zk.stop()
    assert events[3:] == [("demoted", "stopping")]


def test_a_lost_session_registers_and_queues_the_node_again(zk_hosts, flow_name):
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    rec = Recorder()
    me = Leadership(zk, flow_name, "n1", "127.0.0.1:4", rec.promoted, rec.demoted)
    try:
        me.start()
        wait_until(lambda: me.is_master, 5, what="master")
        first_session = zk.client_id[0]
        # Closing a second client that shares the session expires it for the first.
        ghost = KazooClient(hosts=zk_hosts, client_id=zk.client_id, timeout=2.0)
        ghost.start(timeout=5)
        ghost.stop()
        ghost.close()
        wait_until(lambda: len(rec.events) >= 3 and me.is_master, 10, what="promotion in a new session")
        assert rec.events[1][:2] == ("demoted", "session lost")
        assert rec.events[2][0] == "promoted" and rec.events[2][1] > rec.events[0][1]
        assert zk.client_id[0] != first_session
        wait_until(lambda: (m := _member(zk, flow_name, "n1")) and m[:2] == ("127.0.0.1:4", zk.client_id[0]),
                   5, what="the member znode in the new session")
    finally:
        me.stop()
        zk.stop()


def test_members_that_zookeeper_cannot_list_are_unknown_not_none(zk_hosts, flow_name):
    # The trim keeps what every member has not read: "no members" would let it drop a live
    # worker's unread uplink entries, so a ZooKeeper that cannot answer must not read as that.
    zk, other = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0), connect_zookeeper(zk_hosts, 10, 2.0)
    me = Leadership(zk, flow_name, "a", "127.0.0.1:1", lambda e: None, lambda r: None)
    worker = Leadership(other, flow_name, "b", "127.0.0.1:2", lambda e: None, lambda r: None)
    try:
        me.start()
        worker.start()
        wait_until(lambda: me.members() == {"a": "127.0.0.1:1", "b": "127.0.0.1:2"}, 5, what="both members")
        zk.stop()  # this peer's session is gone; the worker is still live
        with pytest.raises(MembersUnknown):
            me.members()
    finally:
        worker.stop()
        other.stop()
        zk.stop()
