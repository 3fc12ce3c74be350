"""Failover in the middle of pending work: node state lives in Redis, so the new master carries on.

Two real ``twinflow run`` processes run the chained flow (history -> AND join
-> action, with the claim pair) against the session's redis-server and
ZooKeeper. The master is SIGKILLed while join groups are half complete and
their time-outs pending.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import settled, wait_until

pytestmark = pytest.mark.cluster

CHAINED = (Path(__file__).parents[2] / "examples" / "cluster-chained.yaml").read_text()


def order(i: int) -> dict:
    return {"id": f"o{i}", "uuid": f"order-{i}", "type": "order", "order_id": i, "seq": 2 * i}


def payment(i: int) -> dict:
    return {"id": f"p{i}", "uuid": f"payment-{i}", "type": "payment", "order_id": i, "seq": 2 * i + 1}


@pytest.mark.flow(text=CHAINED.replace("timeout: 10 ", "timeout: 12 "))
def test_a_new_master_completes_the_old_masters_joins_and_fires_its_time_outs(cluster):
    cluster.peer("a")
    cluster.wait_status("a", role="master")
    cluster.peer("b")
    cluster.wait_status("b", role="worker", streaming=1)

    # Ten orders: ten AND groups half complete, each with a pending time-out, all in Redis.
    cluster.publish([order(i) for i in range(10)])
    state = cluster.key("state:match")
    wait_until(lambda: cluster.redis.hlen(state) == 10, 30, what="ten open join groups in Redis")
    due = {json.loads(k): v["d"] for k, v in
           ((k.decode(), json.loads(v)) for k, v in cluster.redis.hgetall(state).items())}
    assert cluster.redis.hlen(cluster.key("state:guard")) == 10  # the history of the ten orders

    os.killpg(cluster.peers["a"].pid, signal.SIGKILL)
    cluster.wait_status("b", role="master", timeout_s=30)
    # b took over on the history it kept warm from the change log, not by reading it whole.
    wait_until(lambda: "(state: warm copy)" in (cluster.workdir / "b.log").read_text(), 10,
               what="b's promotion on its warm copy")

    # The payments of orders 0-4 complete the old master's groups on the new one; a
    # repeated order (same business UUID, new message ID) is a duplicate for the history.
    cluster.publish([payment(i) for i in range(5)] + [{**order(3), "id": "o3-again"}])
    wait_until(lambda: len(cluster.stream("sink")) == 5, 30, what="five joined pairs in the sink")
    joined = sorted(f["id"] for _, f in cluster.stream("sink"))
    assert joined == sorted(f"o{i}+p{i}" for i in range(5))
    wait_until(lambda: len(cluster.stream("out:guard:duplicate")) == 1, 10, what="the duplicate order")
    assert cluster.stream("out:guard:duplicate")[0][1]["id"] == "o3-again"

    # Orders 5-9 never get a payment: the new master fires the old master's time-outs.
    wait_until(lambda: len(cluster.stream("out:match:expired")) == 5, 40, what="five expired groups")
    expired = cluster.stream("out:match:expired")
    assert sorted(f["id"] for _, f in expired) == [f"o{i}" for i in range(5, 10)]
    for written_at, fields in expired:
        i = int(fields["id"][1:])
        info = json.loads(fields["info"])
        assert info["missing"] == ["payment"] and info["activation"] == i
        late = written_at - due[i]
        assert -0.05 <= late <= 1.0, f"o{i} expired {late:.2f} s after its due time"
    assert cluster.redis.hlen(state) == 0  # nothing left pending

    # Nothing lost, nothing twice: every output once, and the old master, back as a worker, adds nothing.
    cluster.peer("a")
    cluster.wait_status("a", role="worker", streaming=1)
    cluster.publish([order(20), payment(20)])
    wait_until(lambda: len(cluster.stream("sink")) >= 6, 30, what="the pair published after the restart")
    sink = [f["id"] for _, f in settled(lambda: cluster.stream("sink"))]
    assert len(sink) == len(set(sink)) == 6
    assert len(cluster.stream("out:match:expired")) == 5
