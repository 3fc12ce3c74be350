"""Defects of a master's role that need real peer processes, each reproduced and kept fixed: a
stopping master holding a batch, an error during a promotion, a master cut off from Redis.

Every test runs ``twinflow run`` processes against the session's real redis-server and
ZooKeeper; links are faulted with a real TCP proxy, peers with SIGSTOP and SIGTERM. Kept
apart from ``test_defects.py`` so that pytest-xdist runs the two files on two workers.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import wait_until
from twinflow.chaos.fault_link import FaultLink
from twinflow.client import peer_status


def test_a_stopping_master_does_not_commit_the_batch_it_holds(cluster):
    """3: SIGTERM of a lone master holding a batch (ZooKeeper suspended) used to commit it unprocessed."""
    zk_host, zk_port = cluster.services.zk_hosts.split(":")
    proxy = FaultLink((zk_host, int(zk_port))).start()
    try:
        a = cluster.peer("a", zk=proxy.address)
        cluster.wait_status("a", role="master", streaming=1)
        cluster.publish_numbered(10)
        cluster.wait_delivered()
        proxy.cut()                                     # ZooKeeper unreachable: a is SUSPENDED
        cluster.wait_status("a", zookeeper="suspended")
        cluster.publish_numbered(20)
        cluster.wait_status("a", holding=1)                # the batch with them waits for ZooKeeper
        assert a.terminate(deadline_s=60) == 0
        assert len(cluster.sink_ids()) == 10
    finally:
        proxy.stop()
    cluster.peer("a")                                      # back, straight to ZooKeeper
    report = cluster.wait_delivered()
    assert report.exactly_once, report


@pytest.mark.flow(bake_time=30.0)
def test_an_error_during_promotion_loses_nothing_and_the_election_goes_on(cluster):
    """5: Redis refusing writes (OOM) during promotion used to drop the rolled-back
    messages and kill the election thread, leaving no master."""
    cluster.peer("a")
    cluster.wait_status("a", role="master", streaming=1)
    cluster.peer("b", extra=["--worker-read-behind-ms", "0"])  # b bakes before a's session ends
    cluster.wait_status("b", role="worker", streaming=1)
    cluster.publish_numbered(10, "p")
    cluster.wait_delivered()
    os.killpg(cluster.peers["a"].pid, signal.SIGSTOP)
    last = cluster.publish_numbered(20, "q")[-1]
    wait_until(lambda: cluster.read_upto("b") == last, 30, what="b to bake the new messages")
    epoch = cluster.zk_epoch()
    cluster.redis.config_set("maxmemory", 1)                   # every write is refused: OOM
    try:
        cluster.peers["a"].kill()
        # b is promoted, fails to take over, and is promoted again: the election survived.
        wait_until(lambda: cluster.zk_epoch() >= epoch + 2, 30, what="a second promotion attempt")
        assert cluster.peers["b"].alive()
    finally:
        cluster.redis.config_set("maxmemory", 0)
    report = cluster.wait_delivered()
    assert report.exactly_once, report


def test_a_master_cut_off_from_redis_hands_over(cluster):
    """9: a master that reaches ZooKeeper but not Redis gives the role up."""
    host, port = cluster.services.redis_url.split("//")[1].split("/")[0].split(":")
    proxy = FaultLink((host, int(port))).start()
    try:
        cluster.peer("a", redis_url=f"redis://{proxy.address}/0")
        cluster.wait_status("a", role="master", streaming=1)
        a_address = cluster.status("a")["grpc_address"]
        cluster.peer("b")
        cluster.wait_status("b", role="worker", streaming=1)
        cluster.publish_numbered(20)
        cluster.wait_delivered()

        proxy.cut()
        cluster.publish_numbered(30)
        t0 = time.monotonic()
        assert peer_status(a_address, timeout_s=5)["peer_id"] == "a"  # answers while Redis hangs
        assert time.monotonic() - t0 < 5
        cluster.wait_status("b", role="master", timeout_s=30)
        cluster.wait_delivered(timeout_s=60)

        proxy.restore()
        cluster.wait_status("a", role="worker", streaming=1, timeout_s=60)
        cluster.publish_numbered(10)
        report = cluster.wait_delivered()
        assert report.exactly_once, report
    finally:
        proxy.stop()
