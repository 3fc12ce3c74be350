"""Values no store can hold, on a live pair: each such message leaves through the failure
stream with its reason, once, and the flow goes on, through a failover too.

Two ``twinflow run`` processes run the chained flow (history, AND join, action) against
the session's real redis-server and ZooKeeper. Before ``decode`` refused lone UTF-16
surrogates, one ``{"id": "\\ud800"}`` killed the master's batch, then every worker batch
and every promotion's catch-up: no good pair was delivered again.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.cluster.harness import cluster_on
from tests.conftest import settled, wait_until
from twinflow.testing.local_cluster import LocalCluster
from twinflow.testing.messages import order_or_payment

pytestmark = pytest.mark.cluster

CHAINED = Path(__file__).resolve().parents[2] / "examples" / "cluster-chained.yaml"

# Each is valid JSON (a lone surrogate written as an escape) in a field some node uses.
HOSTILE = [
    '{"id": "\\ud800", "type": "order", "order_id": 1, "seq": 1}',
    '{"id": "h-uuid", "uuid": "\\udfff", "type": "order", "order_id": 2, "seq": 2}',
    '{"id": "h-order", "type": "order", "order_id": "a\\ud83d", "seq": 3}',
    '{"id": "h-type", "type": "\\udc00order", "order_id": 4, "seq": 4}',
    '{"id": "h-key", "type": "order", "order_id": 5, "seq": 5, "\\ud800": 1}',
    '{"id": "h-deep", "type": "payment", "order_id": 6, "seq": 6, "x": [{"y": ["\\ud800"]}]}',
]


def pairs(first: int, n: int) -> list[dict]:
    """Orders 1e6+first .. and their payments (far from the hostile ones' order IDs)."""
    docs = []
    for k in range(first, first + n):
        for doc in (order_or_payment(2 * k), order_or_payment(2 * k + 1)):
            docs.append({**doc, "order_id": 1_000_000 + doc["order_id"]})
    return docs


def joined(cluster: LocalCluster) -> list[str]:
    return [f["id"] for _, f in cluster.stream("sink")]


def test_hostile_values_leave_by_the_failure_stream_once_and_a_failover_goes_on(tmp_path, services):
    cluster = cluster_on(services, tmp_path, "t" + uuid.uuid4().hex[:10], text=CHAINED.read_text())
    try:
        cluster.peer("a")
        cluster.wait_status("a", role="master", streaming=1)
        cluster.peer("b")
        cluster.wait_status("b", role="worker", streaming=1)

        # Good pairs around the hostile messages, then the master dies with more to come.
        before, after = pairs(0, 40), pairs(40, 40)
        hostile = []
        for i, body in enumerate(HOSTILE):
            cluster.publish(before[i * 10:(i + 1) * 10])
            hostile.append(cluster.publish_raw(body.encode()))
        cluster.publish(before[60:])
        expected = {f"{o['id']}+{p['id']}" for o, p in zip(before[::2], before[1::2])
                    if o["id"].startswith("o") and p["id"].startswith("p")}
        wait_until(lambda: expected <= set(joined(cluster)), 60, what="the first pairs joined")
        cluster.peers["a"].kill()
        cluster.wait_status("b", role="master", timeout_s=60)
        cluster.publish(after)
        cluster.publish_raw(HOSTILE[0].encode())  # the same value again, after the failover
        hostile.append(cluster.redis.xrevrange(cluster.key("uplink"), count=1)[0][0].decode())
        expected |= {f"{o['id']}+{p['id']}" for o, p in zip(after[::2], after[1::2])
                     if o["id"].startswith("o") and p["id"].startswith("p")}
        wait_until(lambda: expected <= set(joined(cluster)), 60, what="every pair joined after the failover")

        sink = settled(lambda: joined(cluster))
        assert len(sink) == len(set(sink)), "a pair delivered twice"

        def failure_records() -> dict:
            return {f["position"]: f["reason"] for _, f in cluster.stream("failure")}
        # The last hostile entry was published after the last pairs: the batch that records it
        # may come after the one that joined them.
        wait_until(lambda: set(hostile) <= set(failure_records()), 30, what="a failure record for every hostile message")
        failures = failure_records()
        assert all("not valid Unicode" in failures[p] for p in hostile), [failures[p] for p in hostile]
        assert len([p for p in failures if p in hostile]) == len(hostile)  # once each (keyed by position)
        assert cluster.peers["b"].alive()
        assert not any("\\ud800" in json.dumps(i) for i in sink)
    finally:
        cluster.stop()
