"""The review's defects that need real peer processes, each reproduced and kept fixed.

Every test runs ``twinflow run`` processes against the session's real
redis-server and ZooKeeper; links are faulted with a real TCP proxy, peers
with SIGSTOP/SIGKILL/SIGTERM. The numbers are those of the issue that
listed the defects (see each test's docstring).
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from kazoo.client import KazooClient

from tests.cluster.harness import ElectionBlocker
from tests.conftest import wait_until

pytestmark = pytest.mark.cluster


def election_ctime_s(zk_hosts: str, flow: str, peer_id: str) -> float | None:
    """When ``peer_id`` joined the flow's election (ZooKeeper's creation time of its znode);
    None while it has not."""
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=10)
    try:
        path = f"/twinflow/{flow}/election"
        for child in zk.get_children(path):
            data, stat = zk.get(f"{path}/{child}")
            if data.decode() == peer_id:
                return stat.ctime / 1000
        return None
    finally:
        zk.stop()
        zk.close()


@pytest.mark.flow(max_bytes=65536)
def test_bad_messages_go_to_the_failure_stream_and_both_nodes_keep_running(cluster, services):
    """1: a 5,000-digit number or deep nesting used to kill both peers on every restart.
    11: a peer joins the election only once its stream is warm."""
    cluster.peer("a")
    cluster.peer("b")
    cluster.wait_status("a", streaming=1)
    cluster.wait_status("b", streaming=1)
    for peer_id in ("a", "b"):  # joined the election after the warm-up batch
        since = float(cluster.wait_status(peer_id, streaming=1)["streaming_since"])
        # A peer queues once its gate sees it streaming (polled every 0.1 s): wait for it.
        joined = wait_until(lambda: election_ctime_s(services.zk_hosts, cluster.flow, peer_id), 10,
                            what=f"{peer_id} in the election")
        assert joined >= since - 0.05

    cluster.publish_numbered(20)
    bad = {
        cluster.publish_raw(b'{"id": "big", "seq": ' + b"7" * 5000 + b"}"): "longer than",
        cluster.publish_raw(b"[" * 30_000 + b"]" * 30_000): "nesting",
        cluster.publish_raw(b'{"id": "deep", "seq": 1, "x": ' + b"[" * 500 + b"]" * 500 + b"}"): "nesting",
        cluster.publish_raw(b'{"id": "huge", "seq": 1, "pad": "' + b"x" * 70_000 + b'"}'): "over the limit",
    }
    cluster.publish_numbered(20)
    near = json.dumps({"id": "near", "seq": 10_000, "pad": "x" * 65_000}).encode()  # just under max_bytes
    cluster.publish_raw(near)
    cluster.sent.append("near")
    report = cluster.wait_delivered()
    assert report.exactly_once, report

    def failures():
        return {f[b"position"].decode(): f[b"reason"].decode() for _, f in cluster.redis.xrange(cluster.key("failure"))}
    wait_until(lambda: set(bad) <= set(failures()), 10, what="failure records")
    got = failures()
    for position, reason in bad.items():
        assert reason in got[position], (position, got[position])
    assert all(cluster.peers[n].alive() for n in ("a", "b"))


@pytest.mark.flow(bake_time=30.0)
def test_a_restarted_worker_loses_nothing_it_had_baked(cluster, services):
    """2: the worker restarts (its bake is gone, its offset past the messages), then the
    lagging master dies: the promoted worker must still deliver what only it had read."""
    cluster.peer("a")
    cluster.wait_status("a", role="master", streaming=1)
    blocker = ElectionBlocker(services.zk_hosts, cluster.flow)  # queued next: b is not promoted early
    try:
        cluster.peer("b")
        cluster.wait_status("b", role="worker", streaming=1)
        cluster.publish_numbered(20, "p")
        cluster.wait_delivered()

        os.killpg(cluster.peers["a"].pid, signal.SIGSTOP)  # the master lags: it delivers nothing more
        last = cluster.publish_numbered(30, "q")[-1]
        wait_until(lambda: cluster.read_upto("b") == last, 30, what="b to read and bake the new messages")
        cluster.peers["b"].kill()                          # b forgets its bake
        wait_until(lambda: blocker.holding.is_set(), 10, what="a's session to expire")
        cluster.peers["a"].kill()                          # the master dies before delivering q*

        cluster.peer("b")                                  # b restarts past q* ...
        cluster.wait_status("b", streaming=1)
        blocker.release()                               # ... and is promoted
        cluster.wait_status("b", role="master")
        cluster.peer("a")                                  # a comes back as worker and bakes q* again
        cluster.wait_status("a", role="worker", streaming=1)
        cluster.publish_numbered(10, "r")                           # b's claims must not release q* unprocessed
        report = cluster.wait_delivered()
        assert report.exactly_once, report
        assert int(cluster.wait_status("b", role="master")["rolled_back"]) == 30
    finally:
        blocker.release()


def test_a_new_state_dir_neither_rereads_silently_nor_double_feeds(cluster):
    """4: a peer with a wiped state dir used to re-read the uplink and deliver again every
    message whose ID had expired from the ID cache."""
    a = cluster.peer("a")
    cluster.wait_status("a", role="master", streaming=1)
    cluster.publish_numbered(10)
    cluster.wait_delivered()
    assert a.terminate(deadline_s=30) == 0
    (cluster.workdir / "state").rename(cluster.workdir / "state.old")          # a new machine, say
    cluster.redis.delete(*[cluster.key(f"id:{i}") for i in cluster.sent])             # as if id_ttl passed

    refused = cluster.peer("a")
    assert refused.proc.wait(timeout=60) == 4
    assert "--start-from" in refused.log_tail()

    cluster.peer("a", extra=["--start-from", "beginning"])
    cluster.wait_status("a", role="master", streaming=1)
    cluster.publish_numbered(5)
    report = cluster.wait_delivered()
    assert report.exactly_once, report
    assert len(cluster.sink_ids()) == 15


@pytest.mark.flow(max_pending=5, bake_time=1.0)
def test_a_worker_at_max_pending_stops_reading_and_drops_nothing(cluster, services):
    """6: a peer holds at most max_pending messages (5, not 100)."""
    blocker = ElectionBlocker(services.zk_hosts, cluster.flow)  # master that never claims
    try:
        wait_until(lambda: blocker.holding.is_set(), 10, what="the blocker to hold the role")
        cluster.peer("a")
        cluster.wait_status("a", role="worker", streaming=1)
        cluster.publish_numbered(100)
        # Held long enough for what it read to bake fully; it read nothing more meanwhile.
        wait_until(lambda: int(cluster.status("a").get("unclaimed", 0)) >= 5, 30, what="messages to bake fully")
        st = cluster.status("a")
        assert int(st["baked"]) == 5 and st["backpressure"] == "1"
        assert int(st["uplink_lag"]) == 95
        blocker.release()
        report = cluster.wait_delivered()
        assert report.exactly_once, report
    finally:
        blocker.release()
