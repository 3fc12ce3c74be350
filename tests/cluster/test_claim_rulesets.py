"""The seed's whole claim mode on a live pair, against replay: two baking groups with their own
keys and claim IDs, a claim ruleset and nohit traffic (examples/cluster-claim-rulesets.yaml),
through a SIGKILL of the master.

What must hold: the sink and the failure stream hold what ``twinflow replay`` of the same
events gives (every good message once, the bad ones by failure with their reason), and the
worker, before the kill, held each group's messages until their claims came, let the
acknowledgements and notes leave by nohit, and ended holding nothing (RULE_PEND all 0).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import wait_until
from twinflow.client import peer_status
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.positions import position_order
from twinflow.runtime.replay import replay
from twinflow.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster

FLOW = Path(__file__).parents[2] / "examples" / "cluster-claim-rulesets.yaml"


def events(n: int) -> list[dict]:
    """Orders, payments, acknowledgements and notes in turn; every 25th order's key is a bool."""
    docs = []
    for i in range(n):
        kind = ("order", "payment", "ack", "note")[i % 4]
        doc = {"mid": f"m{i:05d}", "kind": kind}
        if kind == "order":
            doc["n"] = True if i % 100 == 0 else i
        elif kind == "payment":
            doc["pay"] = {"seq": i}
        elif kind == "ack":
            doc["n"] = i - 2  # acknowledges the order just before it
        docs.append(doc)
    return docs


def replay_of(docs: list[dict]) -> tuple[list[str], dict[int, str]]:
    """What replay sends out of ``deliver``, and the bad lines (by index) with their reasons."""
    bad: dict[int, str] = {}
    lines = [json.dumps({"at": i * 0.001, **d}) for i, d in enumerate(docs)]
    out = [e["id"] for e in replay(load_graph(FLOW), lines, on_bad=lambda n, why: bad.__setitem__(n - 1, why))]
    return out, bad


def rule_pending(cluster: LocalCluster, peer: str) -> dict:
    return json.loads(cluster.status(peer).get("rule_pending") or "{}")


def held(docs: list[dict]) -> dict:
    """RULE_PEND of a worker that read ``docs`` and saw no claim: each group's good messages."""
    orders = sum(d["kind"] == "order" and d["n"] is not True for d in docs)
    return {"orders": orders, "payments": sum(d["kind"] == "payment" for d in docs), "nohit": 0}


# A ZooKeeper session long enough that a master stopped for a few seconds stays master.
TEXT = FLOW.read_text().replace("session_timeout: 2.0", "session_timeout: 10.0")


@pytest.mark.flow(text=TEXT)
def test_claim_rulesets_live_through_a_master_kill_match_replay(cluster):
    docs = events(600)
    want, bad = replay_of(docs)
    assert len(bad) == 6 and all("ruleset 'orders': key True is not an int" in why for why in bad.values())
    first, second, third = docs[:200], docs[200:400], docs[400:]

    cluster.peer("a")
    cluster.wait_status("a", role="master")
    cluster.peer("b")
    cluster.wait_status("b", role="worker", streaming=1)
    a = cluster.peers["a"].pid

    # 1. The master stops; the worker reads ahead of it and holds each group's messages.
    os.killpg(a, signal.SIGSTOP)
    positions = cluster.publish(first)
    last = positions[-1]
    wait_until(lambda: cluster.read_upto("b") == last, 30, what="b to read the first third")
    wait_until(lambda: rule_pending(cluster, "b") == held(first), 10, what="b's RULE_PEND")
    assert int(cluster.status("b")["nohit"]) == 100  # the acknowledgements and the notes
    over_grpc = peer_status(cluster.status("b")["grpc_address"])  # RULE_PEND in the gRPC status too
    assert over_grpc["rule_pending"] == held(first) and over_grpc["nohit"] == 100
    # 2. The master goes on: its escalations claim, each in its own group, all that b holds.
    os.killpg(a, signal.SIGCONT)
    wait_until(lambda: rule_pending(cluster, "b") == {"orders": 0, "payments": 0, "nohit": 0}, 30,
               what="the master's claims to release b's bake")
    st = cluster.status("b")
    assert int(st["claimed"]) == sum(held(first).values()) and int(st["rolled_back"]) == 0
    notices = [f for _, f in cluster.stream("unclaimed")]  # a slow claim is surfaced, then closed
    assert sorted(f["id"] for f in notices if f["event"] == "surfaced") == \
        sorted(f["id"] for f in notices if f["event"] == "claimed")

    # 3. The master stops again, the worker holds the second third, and the master dies.
    os.killpg(a, signal.SIGSTOP)
    positions += cluster.publish(second)
    last = positions[-1]
    wait_until(lambda: cluster.read_upto("b") == last, 30, what="b to read the second third")
    wait_until(lambda: rule_pending(cluster, "b") == held(second), 10, what="b's RULE_PEND")
    os.killpg(a, signal.SIGKILL)
    cluster.wait_status("b", role="master", timeout_s=60)
    positions += cluster.publish(third)

    wait_until(lambda: len(cluster.stream("sink")) >= len(want), 60, interval_s=0.5, what=f"{len(want)} deliveries")
    sink = [f["id"] for _, f in cluster.stream("sink")]
    assert sorted(sink) == sorted(want) and len(set(sink)) == len(sink)  # nothing lost, nothing twice
    failures = {f["position"]: f["reason"] for _, f in cluster.stream("failure")}
    assert sorted(failures) == sorted(positions[i] for i in bad)  # once each, whichever peer wrote it
    assert all("ruleset 'orders': key True is not an int" in why for why in failures.values())
