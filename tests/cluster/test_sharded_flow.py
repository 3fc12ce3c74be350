"""A two-shard flow on a real Spark standalone cluster (a master and a worker from the pyspark
distribution, on loopback): two ``twinflow run --spark-master spark://...`` nodes run the chained
flow (history -> AND join -> action, with the claim pair) with each shard's work on the cluster's
executors, the master of both shards is killed, the other node takes both over, and every message
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

from tests.cluster.harness import Flow
from tests.conftest import wait_until
from tests.integration.test_metrics import scrape
from twinflow.testing.checker import check_outputs, read_outputs
from twinflow.testing.messages import CHAINED, order_or_payment
from twinflow.cluster.grpc_server import publish as grpc_publish
from twinflow.cluster.master_flow import outlink_streams
from twinflow.cluster.on_cluster import flow_keys
from twinflow.testing.spark_standalone import StandaloneSpark
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.shards import ShardRouter, shard_graph

pytestmark = pytest.mark.cluster

SHARDS = 2


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    # 4 offered cores on this 2-core machine: two nodes' applications, 2 each (spark.cores.max).
    cluster = StandaloneSpark.start(str(tmp_path_factory.mktemp("spark")), cores=4, memory="2g")
    yield cluster
    cluster.stop()


def sharded_text() -> str:
    text = CHAINED.read_text().replace("timeout: 10 ", "timeout: 2 ")
    return text.replace("uplink: {stream: uplink, batch_size: 2000}",
                        f'uplink: {{stream: uplink, batch_size: 2000, shards: {SHARDS}, shard_key: "{{order_id}}"}}')


class Shards:
    """The shards of a flow as the test sees them: their keys, statuses and outputs."""

    def __init__(self, flow: Flow):
        self.flow = flow
        graph = load_graph(flow.path)
        self.router = ShardRouter(graph.cluster.shards, graph.cluster.shard_key)
        self.keys = [flow_keys(shard_graph(graph, k)) for k in range(graph.cluster.shards)]
        self.streams = [outlink_streams(graph, keys) for keys in self.keys]

    def publish(self, docs: list[dict]) -> None:
        pipe = self.flow.r.pipeline(transaction=False)
        for d in docs:
            body = json.dumps(d).encode()
            pipe.xadd(self.keys[self.router.shard_of(body)].uplink, {"data": body})
        pipe.execute()

    def statuses(self, node_id: str) -> list[dict]:
        return [{k.decode(): v.decode() for k, v in self.flow.r.hgetall(keys.node(node_id)).items()}
                for keys in self.keys]

    def wait_roles(self, node_id: str, role: str, timeout_s: float = 120) -> list[dict]:
        def ok():
            rows = self.statuses(node_id)
            return rows if all(r.get("role") == role and r.get("streaming") == "1" for r in rows) else None
        return wait_until(ok, timeout_s, interval_s=0.2, what=f"{node_id} {role} of every shard, streaming")

    def wait_run_on_executors(self, node_id: str) -> None:
        """Every shard's last batch on ``node_id`` ran in a process other than the node's (an executor)."""
        def ok():
            rows = self.statuses(node_id)
            return all(int(r.get("task_pid") or 0) not in (0, int(r["pid"])) for r in rows)
        wait_until(ok, 10, interval_s=0.1, what=f"{node_id}'s status naming the executor that ran each shard")

    def describe(self) -> str:
        """Each shard's uplink, processed mark and node statuses, for a failure message."""
        r = self.flow.r
        return "; ".join(
            f"{keys.flow}: uplink {r.xlen(keys.uplink)} last {r.xrevrange(keys.uplink, count=1)}, "
            f"processed {r.get(keys.processed)}, nodes {[r.hgetall(keys.node(n)) for n in ('a', 'b')]}, "
            f"read {[r.hgetall(keys.read(n)) for n in ('a', 'b')]}"
            for keys in self.keys)

    def outputs(self) -> dict:
        out: dict = {}
        for streams in self.streams:
            for name, entries in read_outputs(self.flow.r, streams).items():
                out.setdefault(name, []).extend(entries)
        return out


def test_a_two_shard_flow_on_a_spark_cluster_survives_a_master_kill(tmp_path, services, flow_name, spark_cluster):
    flow = Flow(tmp_path, flow_name, services, text=sharded_text())
    shards = Shards(flow)
    on_cluster = ["--spark-master", spark_cluster.master_url, "--spark-conf", "spark.cores.max=2",
                  "--spark-conf", "spark.executor.memory=512m"]
    sent: list[str] = []

    def publish(first: int, n: int) -> None:
        docs = [order_or_payment(i) for i in range(first, first + n)]
        shards.publish(docs)
        sent.extend(dict.fromkeys(d["id"] for d in docs))

    try:
        flow.node("a", extra=on_cluster)
        shards.wait_roles("a", "master")
        flow.node("b", extra=on_cluster + ["--metrics-listen", "127.0.0.1:0"])
        shards.wait_roles("b", "worker")
        publish(0, 400)
        wait_until(lambda: len(shards.outputs().get("deliver.done", [])) >= 50, 60, what="the first joined pairs")
        shards.wait_run_on_executors("a")
        # a stops (SIGSTOP, then SIGKILL) with messages b has read and baked but a never processed:
        # b's promotion rolls them back, in each shard, and runs them.
        flow.nodes["a"].pause()
        publish(400, 400)
        wait_until(lambda: all(int(r.get("baked") or 0) > 0 for r in shards.statuses("b")), 30,
                   interval_s=0.05, what="b baking messages of both shards that a did not process")
        os.killpg(flow.nodes["a"].pid, signal.SIGKILL)
        b = shards.wait_roles("b", "master", timeout_s=60)
        wait_until(lambda: all(int(r.get("rolled_back") or 0) > 0 for r in shards.statuses("b")), 30,
                   what="b's catch-up delivering, in each shard, what it had baked")
        # The rest through b's gRPC ingest, which routes each message to its shard.
        docs = [order_or_payment(i) for i in range(800, 1200)]
        bodies = [json.dumps(d).encode() for d in docs]
        positions = grpc_publish(b[0]["grpc_address"], flow.name, bodies)
        assert [p.split("/")[0] for p in positions] == [shards.keys[shards.router.shard_of(x)].flow for x in bodies]
        sent.extend(dict.fromkeys(d["id"] for d in docs))

        def report():
            r = check_outputs(shards.outputs(), sent)
            return r if r.lost == 0 else None
        try:
            result = wait_until(report, 90, interval_s=0.25, what=f"all {len(sent)} messages out of the flow")
        except AssertionError:
            raise AssertionError(f"{check_outputs(shards.outputs(), sent)}; {shards.describe()}") from None
        assert result.duplicated == 0, result
        outputs = shards.outputs()
        # Joined on both masters, in both shards, and the lone orders' time-outs fired too.
        assert {e.node for e in outputs["deliver.done"]} == {"a", "b"}
        assert all(redis.Redis.from_url(services.redis_url).xlen(k.sink) > 0 for k in shards.keys)
        assert outputs.get("match.expired") and outputs.get("guard.duplicate")
        shards.wait_run_on_executors("b")
        # `twinflow status` shows a row per node and shard (a's until its status expires): b master of both.
        out = subprocess.run([sys.executable, "-m", "twinflow.cli", "status", str(flow.path), "--redis",
                              services.redis_url, "--json"], capture_output=True, text=True, timeout=60)
        rows = json.loads(out.stdout)["nodes"]
        assert sorted((r["flow"], r["role"]) for r in rows if r["node_id"] == "b") == [
            (k.flow, "master") for k in shards.keys], out.stderr

        # b's one metrics endpoint serves every shard under the shard's flow name, with what the
        # executors committed for it; its micro-batches under the flow's own name.
        log = open(flow.nodes["b"].log_path, errors="replace").read()
        address = re.search(r"Prometheus metrics on http://([0-9.]+:[0-9]+)/metrics", log).group(1)
        samples = scrape(address)

        def per_shard(name, **labels):
            return {ls["flow"]: v for n, ls, v in samples
                    if n == name and ls["node"] == "b" and all(ls.get(k) == w for k, w in labels.items())}
        assert per_shard("twinflow_is_master") == {k.flow: 1 for k in shards.keys}
        assert all(v > 0 for v in per_shard("twinflow_uplink_read_total").values())
        joined = sum(per_shard("twinflow_outlink_messages_total", outlink="deliver.done").values())
        assert 0 < joined <= sum(e.node == "b" for e in outputs["deliver.done"])
        assert per_shard("twinflow_batch_duration_seconds_count", role="shards")[flow.name] > 0
    finally:
        flow.stop_all()
