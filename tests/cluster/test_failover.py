"""Two real peer processes (Spark, Redis, ZooKeeper, gRPC): failover loses nothing, feeds nothing twice.

These are the slowest tests (each starts two Spark drivers, about 30 s).
"""

import json
import re
import time
from pathlib import Path

import pytest

from twinflow.testing.checker import check_sink, failover_seconds, read_sink
from twinflow.testing.producers import IngestPublisher
from twinflow.testing.local_cluster import LocalCluster
from twinflow.client import peer_status, publish, request_handover
from tests.conftest import wait_until
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.cluster

MESSAGES = 5000
RATE = 1000.0
BAD = [b"{not json", json.dumps({"seq": 1}).encode(), json.dumps({"id": "no-key"}).encode()]


@pytest.fixture
def cluster(request, tmp_path, services, flow_name):
    c = LocalCluster(str(tmp_path), flow=flow_name, services=services).start(peers=False)
    for n in c.peers.values():  # a free port each, found in the peer's log (metrics_address)
        n.extra_args += ["--metrics-listen", "127.0.0.1:0", *getattr(request, "param", ())]
    c.start_peers()
    try:
        c.wait_ready(timeout_s=150)
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()


def metrics_address(cluster, peer_id) -> str:
    """Where the peer serves its metrics, as its log says at start."""
    found = re.search(r"Prometheus metrics on http://([0-9.]+:[0-9]+)/metrics",
                      Path(cluster.peers[peer_id].log_path).read_text(errors="replace"))
    assert found, f"{peer_id} logged no metrics address"
    return found.group(1)


def wait_all_delivered(cluster, ids, timeout_s=90):
    try:
        wait_until(lambda: len({e.id for e in read_sink(cluster.redis, cluster.sink_key)} & set(ids)) == len(ids),
                   timeout_s, interval_s=0.25, what=f"all {len(ids)} messages in the sink")
    except AssertionError:
        print(cluster.logs())
        raise


def test_sigkill_of_master_mid_stream_delivers_every_message_exactly_once(cluster):
    old_master, old_epoch = cluster.master_epoch()
    pub = IngestPublisher(cluster, MESSAGES, RATE)
    pub.start()
    wait_until(lambda: len(pub.ids) >= MESSAGES * 0.4, 30, what="40% published")
    cluster.peers[old_master].kill()
    killed_at = time.time()
    positions = publish(cluster.live_address(avoid=old_master), cluster.flow, BAD)
    pub.join(timeout=60)
    assert pub.error is None and len(pub.ids) == MESSAGES

    wait_all_delivered(cluster, pub.ids)
    entries = read_sink(cluster.redis, cluster.sink_key)
    report = check_sink(entries, pub.ids)
    assert report.exactly_once, report
    assert report.delivered == MESSAGES

    new_master, new_epoch = cluster.master_epoch()
    assert new_master != old_master and new_epoch > old_epoch
    fo = failover_seconds(entries, old_epoch, killed_at)
    print(f"failover: {fo:.2f} s from SIGKILL to the first sink write of the new master")
    assert fo is not None

    # Bad input went to the failure stream with its reason; the flow kept going.
    def failures():
        return {f[b"position"].decode(): f[b"reason"].decode()
                for _, f in cluster.redis.xrange(cluster.failure_key)}
    wait_until(lambda: set(positions) <= set(failures()), 10, what="failure records")
    reasons = [failures()[p] for p in positions]
    assert "not JSON" in reasons[0] and "no ID field" in reasons[1] and "no key field" in reasons[2]


# The worker reads every entry as it comes: a master sends claims only for what its worker has
# read, and a worker reading 3 s behind (the default) would read nothing of the new master's
# 2 s term, so no escalation would reach it for the metrics below to count.
@pytest.mark.parametrize("cluster", [("--worker-read-behind-ms", "0")], indirect=True, ids=["read-at-once"])
def test_graceful_handover_by_rpc_and_by_sigterm_loses_nothing(cluster):
    first, epoch1 = cluster.master_epoch()
    second = next(n for n in cluster.peers if n != first)
    metrics = {n: metrics_address(cluster, n) for n in (first, second)}
    who = {n: {"flow": cluster.flow, "peer": n} for n in (first, second)}

    def metric(peer_id, name, **labels):
        return value(scrape(metrics[peer_id]), name, **labels, **who[peer_id])

    # Role and epoch, as each peer serves them (the worker learns the epoch from Redis's fence).
    assert metric(first, "twinflow_is_master") == 1 and metric(first, "twinflow_epoch") == epoch1
    assert metric(second, "twinflow_role", role="worker") == 1
    wait_until(lambda: metric(second, "twinflow_epoch") == epoch1, 5, what="the worker to see the epoch")
    pub = IngestPublisher(cluster, MESSAGES, RATE)
    pub.start()

    # 1. Admin RPC handover at 30%.
    wait_until(lambda: len(pub.ids) >= MESSAGES * 0.3, 30, what="30% published")
    result = request_handover(cluster.statuses()[first]["grpc_address"], timeout_s=5)
    assert result["ok"] and result["new_master"] == second, result
    print(f"handover by RPC: {result['seconds'] * 1000:.0f} ms")
    wait_until(lambda: (m := cluster.master_epoch()) is not None and m[0] == second, 5, what="second as master")
    assert cluster.master_epoch()[1] > epoch1
    st = peer_status(cluster.statuses()[first]["grpc_address"])
    assert st["role"] == "worker"  # the old master stays, as a worker
    assert metric(second, "twinflow_is_master") == 1 and metric(second, "twinflow_epoch") > epoch1
    wait_until(lambda: metric(first, "twinflow_is_master") == 0, 5, what="first's metrics to show the handover")
    assert metric(first, "twinflow_role", role="worker") == 1

    # 2. SIGTERM of the new master at 70%: it hands back, then exits cleanly.
    wait_until(lambda: len(pub.ids) >= MESSAGES * 0.7, 30, what="70% published")
    assert cluster.peers[second].terminate(deadline_s=30) == 0
    # A stopped peer drops its status: `twinflow status` stops listing it at once (not after the
    # status's TTL), and `status --wait-streaming` would wait for its next process.
    assert second not in cluster.statuses()
    wait_until(lambda: (m := cluster.master_epoch()) is not None and m[0] == first, 10, what="first as master again")

    pub.join(timeout=60)
    assert pub.error is None
    wait_all_delivered(cluster, pub.ids)
    report = check_sink(read_sink(cluster.redis, cluster.sink_key), pub.ids)
    assert report.exactly_once, report

    # first read every message (or, as worker, skipped it as processed: its lag is 0 once it
    # has read up to the end), delivered some as master and had others claimed as worker.
    wait_until(lambda: metric(first, "twinflow_uplink_lag") == 0 and metric(first, "twinflow_uplink_read_total") > 0,
               10, what="first's read up to the uplink's end")
    got = scrape(metrics[first])
    assert value(got, "twinflow_is_master", **who[first]) == 1
    assert value(got, "twinflow_messages_total", outcome="delivered", **who[first]) > 0
    assert value(got, "twinflow_messages_total", outcome="claimed", **who[first]) > 0
    for role in ("master", "worker"):
        assert value(got, "twinflow_batch_duration_seconds_count", role=role, **who[first]) > 0
    assert value(got, "twinflow_escalation_batches_received_total", result="accepted", **who[first]) > 0
