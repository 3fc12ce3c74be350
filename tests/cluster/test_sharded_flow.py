"""A two-shard flow on a real Spark standalone cluster (a master and a worker from the pyspark
distribution, on loopback): two ``twinflow run --spark-master spark://...`` peers run the chained
flow (history -> AND join -> action, with the claim pair) with each shard's work on the cluster's
executors, the master of both shards is killed, the other peer takes both over, and every message
leaves the flow exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import redis

from tests.cluster.harness import cluster_on
from tests.conftest import settled, wait_until
from tests.integration.test_metrics import scrape
from twinflow.testing.local_cluster import LocalCluster
from twinflow.testing.messages import CHAINED, order_or_payment
from twinflow.client import publish as grpc_publish
from twinflow.testing.spark_standalone import StandaloneSpark

pytestmark = pytest.mark.cluster

SHARDS = 2


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    # 4 offered cores on this 2-core machine: two peers' applications, 2 each (spark.cores.max).
    cluster = StandaloneSpark.start(str(tmp_path_factory.mktemp("spark")), cores=4, memory="2g")
    yield cluster
    cluster.stop()


def sharded_text() -> str:
    text = CHAINED.read_text().replace("timeout: 10 ", "timeout: 2 ")
    return text.replace("uplink: {stream: uplink, batch_size: 2000}",
                        f'uplink: {{stream: uplink, batch_size: 2000, shards: {SHARDS}, shard_key: "{{order_id}}"}}')


def wait_run_on_executors(cluster: LocalCluster, peer_id: str) -> None:
    """Every shard's last batch on ``peer_id`` ran in a process other than the peer's (an executor)."""
    def ok():
        rows = cluster.shard_statuses(peer_id)
        return all(int(r.get("task_pid") or 0) not in (0, int(r["pid"])) for r in rows)
    wait_until(ok, 10, interval_s=0.1, what=f"{peer_id}'s status naming the executor that ran each shard")


def test_a_two_shard_flow_on_a_spark_cluster_survives_a_master_kill(tmp_path, services, flow_name, spark_cluster):
    cluster = cluster_on(services, tmp_path, flow_name, text=sharded_text())
    on_cluster = ["--spark-master", spark_cluster.master_url, "--spark-conf", "spark.cores.max=2",
                  "--spark-conf", "spark.executor.memory=512m"]
    sent: list[str] = []

    def publish(first: int, n: int) -> None:
        docs = [order_or_payment(i) for i in range(first, first + n)]
        cluster.publish(docs)  # each to its shard's uplink
        sent.extend(dict.fromkeys(d["id"] for d in docs))

    try:
        cluster.peer("a", extra=on_cluster)
        cluster.wait_shards("a", "master")
        cluster.peer("b", extra=on_cluster + ["--metrics-listen", "127.0.0.1:0"])
        cluster.wait_shards("b", "worker")
        publish(0, 400)
        wait_until(lambda: len(cluster.outputs().get("deliver.done", [])) >= 50, 60, what="the first joined pairs")
        wait_run_on_executors(cluster, "a")
        # a's JVM stops (SIGSTOP; a keeps its ZooKeeper session, so b stays worker however long its
        # batches take on a busy machine), then a dies (SIGKILL) with messages b has read and baked
        # but a never processed: b's promotion rolls them back, in each shard, and runs them.
        cluster.peers["a"].pause_jvm()
        publish(400, 400)
        wait_until(lambda: all(int(r.get("baked") or 0) > 0 for r in cluster.shard_statuses("b")), 90,
                   interval_s=0.05, what="b baking messages of both shards that a did not process")
        os.killpg(cluster.peers["a"].pid, signal.SIGKILL)
        b = cluster.wait_shards("b", "master", timeout_s=60)
        wait_until(lambda: all(int(r.get("rolled_back") or 0) > 0 for r in cluster.shard_statuses("b")), 30,
                   what="b's catch-up delivering, in each shard, what it had baked")
        # The rest through b's gRPC ingest, which routes each message to its shard.
        docs = [order_or_payment(i) for i in range(800, 1200)]
        bodies = [json.dumps(d).encode() for d in docs]
        positions = grpc_publish(b[0]["grpc_address"], cluster.flow, bodies)
        assert [p.split("/")[0] for p in positions] == [cluster.shard_keys[cluster.router.shard_of(x)].flow for x in bodies]
        sent.extend(dict.fromkeys(d["id"] for d in docs))

        def report():
            r = cluster.check(sent)
            return r if r.lost == 0 else None
        try:
            wait_until(report, 90, interval_s=0.25, what=f"all {len(sent)} messages out of the flow")
        except AssertionError:
            raise AssertionError(f"{cluster.check(sent)}; {cluster.describe_shards()}") from None
        result = settled(lambda: cluster.check(sent))
        assert result.lost == 0 and result.duplicated == 0, result
        outputs = cluster.outputs()
        # Joined on both masters, in both shards, and the lone orders' time-outs fired too.
        assert {e.peer for e in outputs["deliver.done"]} == {"a", "b"}
        assert all(redis.Redis.from_url(services.redis_url).xlen(k.sink) > 0 for k in cluster.shard_keys)
        assert outputs.get("match.expired") and outputs.get("guard.duplicate")
        wait_run_on_executors(cluster, "b")
        # `twinflow status` shows a row per peer and shard (a's until its status expires): b master of both.
        out = subprocess.run([sys.executable, "-m", "twinflow.cli", "status", str(cluster.flow_path), "--redis",
                              services.redis_url, "--json"], capture_output=True, text=True, timeout=60)
        rows = json.loads(out.stdout)["peers"]
        assert sorted((r["flow"], r["role"]) for r in rows if r["peer_id"] == "b") == [
            (k.flow, "master") for k in cluster.shard_keys], out.stderr

        # b's one metrics endpoint serves every shard under the shard's flow name, with what the
        # executors committed for it; its micro-batches under the flow's own name.
        log = open(cluster.peers["b"].log_path, errors="replace").read()
        address = re.search(r"Prometheus metrics on http://([0-9.]+:[0-9]+)/metrics", log).group(1)
        samples = scrape(address)

        def per_shard(name, **labels):
            return {ls["flow"]: v for n, ls, v in samples
                    if n == name and ls["peer"] == "b" and all(ls.get(k) == w for k, w in labels.items())}
        assert per_shard("twinflow_is_master") == {k.flow: 1 for k in cluster.shard_keys}
        assert all(v > 0 for v in per_shard("twinflow_uplink_read_total").values())
        joined = sum(per_shard("twinflow_outlink_messages_total", outlink="deliver.done").values())
        assert 0 < joined <= sum(e.peer == "b" for e in outputs["deliver.done"])
        assert per_shard("twinflow_batch_duration_seconds_count", role="shards")[cluster.flow] > 0
    finally:
        cluster.stop()
