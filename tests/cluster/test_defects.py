"""The review's defects that need real node processes, each reproduced and kept fixed.

Every test runs ``twinflow run`` processes against the session's real
redis-server and ZooKeeper; links are faulted with a real TCP proxy, nodes
with SIGSTOP/SIGKILL/SIGTERM. The numbers are those of the issue that
listed the defects (see each test's docstring).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from kazoo.client import KazooClient

from tests.cluster.harness import ElectionBlocker, Flow
from tests.conftest import wait_until
from twinflow.chaos.fault_link import FaultLink
from twinflow.cluster.grpc_server import node_status

pytestmark = pytest.mark.cluster


@pytest.fixture
def flow(tmp_path, services, flow_name, request):
    marker = request.node.get_closest_marker("flow")
    f = Flow(tmp_path, flow_name, services, **(marker.kwargs if marker else {}))
    yield f
    f.stop_all()


def election_ctime_s(zk_hosts: str, flow: str, node_id: str) -> float | None:
    """When ``node_id`` joined the flow's election (ZooKeeper's creation time of its znode);
    None while it has not."""
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=10)
    try:
        path = f"/twinflow/{flow}/election"
        for child in zk.get_children(path):
            data, stat = zk.get(f"{path}/{child}")
            if data.decode() == node_id:
                return stat.ctime / 1000
        return None
    finally:
        zk.stop()
        zk.close()


@pytest.mark.flow(max_bytes=65536)
def test_bad_messages_go_to_the_failure_stream_and_both_nodes_keep_running(flow, services):
    """1: a 5,000-digit number or deep nesting used to kill both nodes on every restart.
    11: a node joins the election only once its stream is warm."""
    flow.node("a")
    flow.node("b")
    flow.wait_status("a", streaming=1)
    flow.wait_status("b", streaming=1)
    for node_id in ("a", "b"):  # joined the election after the warm-up batch
        since = float(flow.wait_status(node_id, streaming=1)["streaming_since"])
        # A node queues once its gate sees it streaming (polled every 0.1 s): wait for it.
        joined = wait_until(lambda: election_ctime_s(services.zk_hosts, flow.name, node_id), 10,
                            what=f"{node_id} in the election")
        assert joined >= since - 0.05

    flow.publish(20)
    bad = {
        flow.publish_raw(b'{"id": "big", "seq": ' + b"7" * 5000 + b"}"): "longer than",
        flow.publish_raw(b"[" * 30_000 + b"]" * 30_000): "nesting",
        flow.publish_raw(b'{"id": "deep", "seq": 1, "x": ' + b"[" * 500 + b"]" * 500 + b"}"): "nesting",
        flow.publish_raw(b'{"id": "huge", "seq": 1, "pad": "' + b"x" * 70_000 + b'"}'): "over the limit",
    }
    flow.publish(20)
    near = json.dumps({"id": "near", "seq": 10_000, "pad": "x" * 65_000}).encode()  # just under max_bytes
    flow.publish_raw(near)
    flow.sent.append("near")
    report = flow.wait_delivered()
    assert report.exactly_once, report

    def failures():
        return {f[b"position"].decode(): f[b"reason"].decode() for _, f in flow.r.xrange(flow.key("failure"))}
    wait_until(lambda: set(bad) <= set(failures()), 10, what="failure records")
    got = failures()
    for position, reason in bad.items():
        assert reason in got[position], (position, got[position])
    assert all(flow.nodes[n].alive() for n in ("a", "b"))


@pytest.mark.flow(bake_time=30.0)
def test_a_restarted_worker_loses_nothing_it_had_baked(flow, services):
    """2: the worker restarts (its bake is gone, its offset past the messages), then the
    lagging master dies: the promoted worker must still deliver what only it had read."""
    flow.node("a")
    flow.wait_status("a", role="master", streaming=1)
    blocker = ElectionBlocker(services.zk_hosts, flow.name)  # queued next: b is not promoted early
    try:
        flow.node("b")
        flow.wait_status("b", role="worker", streaming=1)
        flow.publish(20, "p")
        flow.wait_delivered()

        os.killpg(flow.nodes["a"].pid, signal.SIGSTOP)  # the master lags: it delivers nothing more
        last = flow.publish(30, "q")[-1]
        wait_until(lambda: flow.read_upto("b") == last, 30, what="b to read and bake the new messages")
        flow.nodes["b"].kill()                          # b forgets its bake
        wait_until(lambda: blocker.holding.is_set(), 10, what="a's session to expire")
        flow.nodes["a"].kill()                          # the master dies before delivering q*

        flow.node("b")                                  # b restarts past q* ...
        flow.wait_status("b", streaming=1)
        blocker.release()                               # ... and is promoted
        flow.wait_status("b", role="master")
        flow.node("a")                                  # a comes back as worker and bakes q* again
        flow.wait_status("a", role="worker", streaming=1)
        flow.publish(10, "r")                           # b's claims must not release q* unprocessed
        report = flow.wait_delivered()
        assert report.exactly_once, report
        assert int(flow.wait_status("b", role="master")["rolled_back"]) == 30
    finally:
        blocker.release()


def test_a_stopping_master_does_not_commit_the_batch_it_holds(flow):
    """3: SIGTERM of a lone master holding a batch (ZooKeeper suspended) used to commit it unprocessed."""
    zk_host, zk_port = flow.services.zk_hosts.split(":")
    proxy = FaultLink((zk_host, int(zk_port))).start()
    try:
        a = flow.node("a", zk=proxy.address)
        flow.wait_status("a", role="master", streaming=1)
        flow.publish(10)
        flow.wait_delivered()
        proxy.cut()                                     # ZooKeeper unreachable: a is SUSPENDED
        flow.wait_status("a", zookeeper="suspended")
        flow.publish(20)
        flow.wait_status("a", holding=1)                # the batch with them waits for ZooKeeper
        assert a.terminate(deadline_s=60) == 0
        assert len(flow.sink_ids()) == 10
    finally:
        proxy.stop()
    flow.node("a")                                      # back, straight to ZooKeeper
    report = flow.wait_delivered()
    assert report.exactly_once, report


def test_a_new_state_dir_neither_rereads_silently_nor_double_feeds(flow):
    """4: a node with a wiped state dir used to re-read the uplink and deliver again every
    message whose ID had expired from the ID cache."""
    a = flow.node("a")
    flow.wait_status("a", role="master", streaming=1)
    flow.publish(10)
    flow.wait_delivered()
    assert a.terminate(deadline_s=30) == 0
    (flow.workdir / "state").rename(flow.workdir / "state.old")          # a new machine, say
    flow.r.delete(*[flow.key(f"id:{i}") for i in flow.sent])             # as if id_ttl passed

    refused = flow.node("a")
    assert refused.proc.wait(timeout=60) == 4
    assert "--start-from" in refused.log_tail()

    flow.node("a", extra=["--start-from", "beginning"])
    flow.wait_status("a", role="master", streaming=1)
    flow.publish(5)
    report = flow.wait_delivered()
    assert report.exactly_once, report
    assert len(flow.sink_ids()) == 15


@pytest.mark.flow(bake_time=30.0)
def test_an_error_during_promotion_loses_nothing_and_the_election_goes_on(flow):
    """5: Redis refusing writes (OOM) during promotion used to drop the rolled-back
    messages and kill the election thread, leaving no master."""
    flow.node("a")
    flow.wait_status("a", role="master", streaming=1)
    flow.node("b")
    flow.wait_status("b", role="worker", streaming=1)
    flow.publish(10, "p")
    flow.wait_delivered()
    os.killpg(flow.nodes["a"].pid, signal.SIGSTOP)
    last = flow.publish(20, "q")[-1]
    wait_until(lambda: flow.read_upto("b") == last, 30, what="b to bake the new messages")
    epoch = flow.zk_epoch()
    flow.r.config_set("maxmemory", 1)                   # every write is refused: OOM
    try:
        flow.nodes["a"].kill()
        # b is promoted, fails to take over, and is promoted again: the election survived.
        wait_until(lambda: flow.zk_epoch() >= epoch + 2, 30, what="a second promotion attempt")
        assert flow.nodes["b"].alive()
    finally:
        flow.r.config_set("maxmemory", 0)
    report = flow.wait_delivered()
    assert report.exactly_once, report


@pytest.mark.flow(max_pending=5, bake_time=1.0)
def test_a_worker_at_max_pending_stops_reading_and_drops_nothing(flow, services):
    """6: max_pending used to be ignored (a node with max_pending 5 held 100)."""
    blocker = ElectionBlocker(services.zk_hosts, flow.name)  # master that never claims
    try:
        wait_until(lambda: blocker.holding.is_set(), 10, what="the blocker to hold the role")
        flow.node("a")
        flow.wait_status("a", role="worker", streaming=1)
        flow.publish(100)
        # Held long enough for what it read to bake fully; it read nothing more meanwhile.
        wait_until(lambda: int(flow.status("a").get("unclaimed", 0)) >= 5, 30, what="messages to bake fully")
        st = flow.status("a")
        assert int(st["baked"]) == 5 and st["backpressure"] == "1"
        assert int(st["uplink_lag"]) == 95
        blocker.release()
        report = flow.wait_delivered()
        assert report.exactly_once, report
    finally:
        blocker.release()


def test_a_master_cut_off_from_redis_hands_over(flow):
    """9: a master that reaches ZooKeeper but not Redis used to keep the role forever."""
    host, port = flow.services.redis_url.split("//")[1].split("/")[0].split(":")
    proxy = FaultLink((host, int(port))).start()
    try:
        flow.node("a", redis_url=f"redis://{proxy.address}/0")
        flow.wait_status("a", role="master", streaming=1)
        a_address = flow.status("a")["grpc_address"]
        flow.node("b")
        flow.wait_status("b", role="worker", streaming=1)
        flow.publish(20)
        flow.wait_delivered()

        proxy.cut()
        flow.publish(30)
        t0 = time.monotonic()
        assert node_status(a_address, timeout_s=5)["node_id"] == "a"  # answers while Redis hangs
        assert time.monotonic() - t0 < 5
        flow.wait_status("b", role="master", timeout_s=30)
        flow.wait_delivered(timeout_s=60)

        proxy.restore()
        flow.wait_status("a", role="worker", streaming=1, timeout_s=60)
        flow.publish(10)
        report = flow.wait_delivered()
        assert report.exactly_once, report
    finally:
        proxy.stop()
