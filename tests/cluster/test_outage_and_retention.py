"""Redis stopped under load: the peers wait, say so in their status, and resume; nothing lost or fed twice.
The uplink stays bounded: entries go once read by every live peer and processed.

The cluster gets its own Redis (append-only file on), which the test stops
with SIGTERM mid-stream and starts again on the same port and data.
"""

import json
import subprocess
import sys
import time

import pytest
import redis

from twinflow.testing.checker import check_sink, read_sink
from twinflow.testing.local_cluster import CLAIM_PAIR, LocalCluster
from twinflow.client import peer_status
from twinflow.runtime.positions import position_order
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.step import Step
from tests.conftest import settled, wait_until

pytestmark = pytest.mark.cluster


def publish(store: FlowStore, first: int, n: int) -> list[str]:
    docs = [{"id": f"m{i}", "seq": i} for i in range(first, first + n)]
    for i in range(0, n, 500):
        store.publish(json.dumps(d).encode() for d in docs[i:i + 500])
    return [d["id"] for d in docs]


def status_cli(flow_path, redis_url: str, peers: list[str]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "twinflow.cli", "status", str(flow_path), "--redis", redis_url, "--json"]
    for address in peers:
        args += ["--peer", address]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_redis_stopped_under_load_nodes_wait_report_it_and_resume(tmp_path, flow_name):
    # retention 0: the master trims the uplink as soon as it is safe (every 10 s)
    text = CLAIM_PAIR.format(name=flow_name, bake_time=5.0).replace("{stream: uplink}", "{stream: uplink, retention: 0}")
    assert "retention: 0" in text
    cluster = LocalCluster(str(tmp_path), flow=flow_name, text=text).start(peers=False)
    store = FlowStore(cluster.redis, FlowKeys(flow_name), "test")
    try:
        cluster.start_peers()
        cluster.wait_ready(timeout_s=150)
        statuses = cluster.statuses()
        addresses = [s["grpc_address"] for s in statuses.values()]
        sent = publish(store, 0, 4000)
        wait_until(lambda: cluster.sink_count() >= 500, 60, what="the master delivering")
        cluster.services.stop_redis()

        # Each peer says Redis is down, over gRPC (its status in Redis cannot be written).
        def all_report_down():
            return all(peer_status(a)["redis"].startswith("down") for a in addresses)
        wait_until(all_report_down, 30, what="both peers reporting Redis down")
        out = status_cli(cluster.flow_path, cluster.services.redis_url, addresses)
        assert out.returncode == 0, out.stderr
        assert "did not answer" in out.stderr
        rows = json.loads(out.stdout)["peers"]
        assert sorted(r["peer_id"] for r in rows) == sorted(statuses)
        assert all(r["redis"].startswith("down") for r in rows)

        cluster.services.start_redis_again()
        wait_until(lambda: all(peer_status(a)["redis"] == "ok" for a in addresses), 60,
                   what="both peers reporting Redis back")
        sent += publish(store, 4000, 2000)
        wait_until(lambda: len({e.id for e in read_sink(cluster.redis, cluster.sink_key)}) >= len(sent), 120,
                   interval_s=0.25, what=f"all {len(sent)} messages in the sink")
        report = check_sink(settled(lambda: read_sink(cluster.redis, cluster.sink_key)), sent)
        assert report.lost == 0 and report.duplicated == 0, report
        out = status_cli(cluster.flow_path, cluster.services.redis_url, [])
        assert out.returncode == 0 and all(r["redis"] == "ok" for r in json.loads(out.stdout)["peers"])

        # Bounded uplink: the master trims what both peers read and the flow processed.
        wait_until(lambda: store.trimmed_before() is not None, 30, what="the master trimming the uplink")
        kept = store.trimmed_before()
        assert cluster.redis.xlen(store.keys.uplink) < len(sent)
        assert cluster.redis.xrange(store.keys.uplink, "-", "(" + kept) == []  # all before it gone
        for peer_id in statuses:  # never past where a live peer read
            assert position_order(store.read_position(peer_id)) >= position_order(kept)
        assert position_order(store.processed_mark()) >= position_order(kept)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


def test_a_node_away_longer_than_the_retention_refuses_to_resume(tmp_path, services, flow_name):
    # Its checkpoint would resume after entry 2; the master trimmed up to entry 5 meanwhile.
    flow_path = tmp_path / "flow.yaml"
    flow_path.write_text(CLAIM_PAIR.format(name=flow_name, bake_time=5.0))
    store = FlowStore(redis.Redis.from_url(services.redis_url), FlowKeys(flow_name), "node-a")
    ids = store.publish([json.dumps({"id": f"m{i}", "seq": i}).encode() for i in range(8)])
    store.commit(1, Step(mark=ids[5]))
    store.r.hset(store.keys.read("node-a"), "read_id", ids[2])
    store.r.hset(store.keys.read("node-b"), "read_id", ids[6])
    assert store.trim_uplink(["node-b"], 0, time.time() + 1) == (5, ids[5])
    start = tmp_path / "state" / flow_name / "node-a" / "start.json"
    start.parent.mkdir(parents=True)
    start.write_text(json.dumps({"id": "0-0", "n": 0}))  # node-a has run here before
    run = [sys.executable, "-m", "twinflow.cli", "run", str(flow_path), "--peer-id", "node-a",
           "--redis", services.redis_url, "--zk", services.zk_hosts, "--state-dir", str(tmp_path / "state")]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 4, out.stderr[-2000:]  # EXIT_REFUSED, before Spark starts
    assert f"trimmed up to {ids[5]}" in out.stderr and "--start-from processed" in out.stderr
