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

from tests.cluster.harness import Flow
from tests.conftest import wait_until

pytestmark = pytest.mark.cluster

CHAINED = (Path(__file__).parents[2] / "examples" / "cluster-chained.yaml").read_text()


@pytest.fixture
def flow(tmp_path, services, flow_name):
    f = Flow(tmp_path, flow_name, services, text=CHAINED.replace("timeout: 10 ", "timeout: 12 "))
    yield f
    f.stop_all()


def order(i: int) -> dict:
    return {"id": f"o{i}", "uuid": f"order-{i}", "type": "order", "order_id": i, "seq": 2 * i}


def payment(i: int) -> dict:
    return {"id": f"p{i}", "uuid": f"payment-{i}", "type": "payment", "order_id": i, "seq": 2 * i + 1}


def test_a_new_master_completes_the_old_masters_joins_and_fires_its_time_outs(flow):
    flow.node("a")
    flow.wait_status("a", role="master")
    flow.node("b")
    flow.wait_status("b", role="worker", streaming=1)

    # Ten orders: ten AND groups half complete, each with a pending time-out, all in Redis.
    flow.publish_docs([order(i) for i in range(10)])
    state = flow.key("state:match")
    wait_until(lambda: flow.r.hlen(state) == 10, 30, what="ten open join groups in Redis")
    due = {json.loads(k): v["d"] for k, v in
           ((k.decode(), json.loads(v)) for k, v in flow.r.hgetall(state).items())}
    assert flow.r.hlen(flow.key("state:guard")) == 10  # the history of the ten orders

    os.killpg(flow.nodes["a"].pid, signal.SIGKILL)
    flow.wait_status("b", role="master", timeout_s=30)

    # The payments of orders 0-4 complete the old master's groups on the new one; a
    # repeated order (same business UUID, new message ID) is a duplicate for the history.
    flow.publish_docs([payment(i) for i in range(5)] + [{**order(3), "id": "o3-again"}])
    wait_until(lambda: len(flow.stream("sink")) == 5, 30, what="five joined pairs in the sink")
    joined = sorted(f["id"] for _, f in flow.stream("sink"))
    assert joined == sorted(f"o{i}+p{i}" for i in range(5))
    wait_until(lambda: len(flow.stream("out:guard:duplicate")) == 1, 10, what="the duplicate order")
    assert flow.stream("out:guard:duplicate")[0][1]["id"] == "o3-again"

    # Orders 5-9 never get a payment: the new master fires the old master's time-outs.
    wait_until(lambda: len(flow.stream("out:match:expired")) == 5, 40, what="five expired groups")
    expired = flow.stream("out:match:expired")
    assert sorted(f["id"] for _, f in expired) == [f"o{i}" for i in range(5, 10)]
    for written_at, fields in expired:
        i = int(fields["id"][1:])
        info = json.loads(fields["info"])
        assert info["missing"] == ["payment"] and info["activation"] == i
        late = written_at - due[i]
        assert -0.05 <= late <= 1.0, f"o{i} expired {late:.2f} s after its due time"
    assert flow.r.hlen(state) == 0  # nothing left pending

    # Nothing lost, nothing twice: every output once, and the old master, back as a worker, adds nothing.
    flow.node("a")
    flow.wait_status("a", role="worker", streaming=1)
    flow.publish_docs([order(20), payment(20)])
    wait_until(lambda: len(flow.stream("sink")) == 6, 30, what="the pair published after the restart")
    sink = [f["id"] for _, f in flow.stream("sink")]
    assert len(sink) == len(set(sink)) == 6
    assert len(flow.stream("out:match:expired")) == 5
