"""Two writers of one shard's state, in two real executor processes, against a real Redis.

A sharded flow's master runs each shard's batch in whichever Spark executor
process reads it (``cluster.shard_task.run_shard``), and a process keeps the
shard's flow between batches. Two processes may therefore hold the same
shard's state at once: one kept from an earlier batch while another ran the
next, or two attempts of one task that Spark runs together (speculation, an
executor declared lost while still working). Every COMMIT names the state
version its step was built from, so whichever writer is behind writes
nothing and builds again on the state Redis holds. Before the version, both
tests here failed: a time-out fired twice, and a batch was delivered twice.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
import redis

from twinflow.testing.checker import read_outputs
from twinflow.cluster.master_flow import outlink_streams
from twinflow.cluster.on_cluster import flow_keys
from twinflow.cluster.shard_task import ShardPlan, run_shard
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_store import FlowStore

HEADER = """
flow: {name}
uplink: {{stream: uplink, batch_size: 5000}}
message: {{id: id, id_ttl: 3600}}
"""
JOIN_FLOW = HEADER + """input: match
nodes:
  match: {{type: join, join_type: and, types: [order, payment], type_field: type, activation_field: order_id,
          timeout: 10}}
"""
DELIVER_FLOW = HEADER + """input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
"""


def _executor(commit_delay_s: float = 0.0) -> ProcessPoolExecutor:
    """One executor process (spawned, so it shares nothing with this one but Redis)."""
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_slow_commits, initargs=(commit_delay_s,))


def _slow_commits(delay_s: float) -> None:
    """Runs in the executor process: every COMMIT reaches Redis ``delay_s`` late (a slow link),
    so two attempts of one task interleave their steps."""
    if delay_s <= 0:
        return
    commit = FlowStore.commit

    def late(self, *args, **kwargs):
        time.sleep(delay_s)  # the latency being simulated, not a wait for a condition
        return commit(self, *args, **kwargs)
    FlowStore.commit = late


def _publish(r: redis.Redis, uplink: str, docs: list[dict]) -> list[tuple]:
    """Append ``docs`` to the uplink; the rows a Spark task would read for them."""
    import json
    rows = []
    for d in docs:
        body = json.dumps(d).encode()
        rows.append((r.xadd(uplink, {"data": body}).decode(), body, len(body)))
    return rows


def _plan(text: str, redis_url: str, now: float) -> ShardPlan:
    return ShardPlan(flow_text=text, flow_source="test", redis_url=redis_url, peer_id="a", now=now,
                     connect_deadline_s=10.0, roles={0: ("master", 1)})


def _left(r: redis.Redis, text: str, outlink: str) -> list[str]:
    graph = parse_graph(text, "test")
    outputs = read_outputs(r, outlink_streams(graph, flow_keys(graph)))
    return [e.id for e in outputs[outlink]]


def test_a_flow_kept_by_one_executor_does_not_fire_a_time_out_a_retry_fired_elsewhere(redis_url, flow_name):
    text = JOIN_FLOW.format(name=flow_name)
    keys = flow_keys(parse_graph(text, "test"))
    r = redis.Redis.from_url(redis_url)
    x, y = _executor(), _executor()
    try:
        # X runs batch 1 (o1's group opens, due at 110) and keeps the flow. Spark runs the
        # task again on Y (an executor declared lost): Y loads the state, fires o1's time-out,
        # finds the rows processed (the mark does not move). Batch 2 lands on X again.
        batch1 = _publish(r, keys.uplink, [{"id": "m1", "type": "order", "order_id": "o1"}])
        first = x.submit(run_shard, _plan(text, redis_url, now=100.0), 0, batch1).result(60)
        retry = y.submit(run_shard, _plan(text, redis_url, now=111.0), 0, batch1).result(60)
        batch2 = _publish(r, keys.uplink, [{"id": "m2", "type": "order", "order_id": "o2"}])
        second = x.submit(run_shard, _plan(text, redis_url, now=112.0), 0, batch2).result(60)
    finally:
        x.shutdown(), y.shutdown()
    assert first.pid == second.pid != retry.pid  # two executor processes, X kept its flow
    assert not (first.msgs or retry.msgs or second.msgs), "every batch committed"
    assert retry.skipped == 1 and second.delivered == 1
    assert _left(r, text, "match.expired") == ["m1"]  # o1's time-out fired once


@pytest.mark.parametrize("trial", range(2))
def test_two_attempts_of_one_shard_task_deliver_each_message_once(redis_url, flow_name, trial):
    text = DELIVER_FLOW.format(name=flow_name)
    keys = flow_keys(parse_graph(text, "test"))
    r = redis.Redis.from_url(redis_url)
    rows = _publish(r, keys.uplink, [{"id": f"m{i}"} for i in range(3000)])  # three steps of 1,000
    fast, slow = _executor(0.06), _executor(0.15)
    try:
        # Warm both processes up (Python start, imports) so the two attempts really overlap.
        for ex in (fast, slow):
            assert ex.submit(run_shard, _plan(text, redis_url, now=1.0), -1, []).result(60).warm
        start = threading.Barrier(2)

        def attempt(ex):
            start.wait(10)
            return ex.submit(run_shard, _plan(text, redis_url, now=1.0), 0, rows)
        futures = []
        threads = [threading.Thread(target=lambda ex=ex: futures.append(attempt(ex))) for ex in (fast, slow)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        results = [f.result(120) for f in futures]
    finally:
        fast.shutdown(), slow.shutdown()
    assert all(not res.msgs for res in results), "both attempts end with the batch committed"
    sink = _left(r, text, "deliver.done")
    assert len(sink) == 3000 and len(set(sink)) == 3000, f"{len(sink)} sink entries for {len(set(sink))} IDs"
    assert sum(res.delivered for res in results) == 3000  # between them, each message ran once
