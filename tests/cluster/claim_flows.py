"""A claim flow on a live pair, against replay, through a SIGKILL of the master (the tests:
test_claim_rulesets.py, the seed's whole claim mode, examples/cluster-claim-rulesets.yaml; and
test_claim_short_form.py, the short form, examples/cluster.yaml; one file each, so that
pytest-xdist runs them on two workers). The rulesets case reads its keys as floats, time stamps
with fractions among them, so that a ruleset without ``id`` claims by the key's one text ("12.25",
"13.0") on the pair as replay's sort does; the short form keeps int keys.

What must hold: the sink and the failure stream hold what ``twinflow replay`` of the same
events gives (every good message once, the bad ones by failure with their reason); the worker,
with its master stopped, holds each group's messages (RULE_PEND, over Redis and gRPC) and lets
the rest leave by nohit; the master's escalations, once it goes on, claim in each group all
that the worker holds; and with the master stopped again and killed, the promoted worker
delivers what it held.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.conftest import settled, wait_until
from twinflow.client import peer_status
from twinflow.runtime.fields import BadInput
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.replay import replay
from twinflow.testing.local_cluster import LocalCluster
from twinflow.testing.messages import order_or_payment

EXAMPLES = Path(__file__).parents[2] / "examples"
RULESETS, SHORT = EXAMPLES / "cluster-claim-rulesets.yaml", EXAMPLES / "cluster.yaml"


def rulesets_events(n: int) -> list[dict]:
    """Orders, payments, acknowledgements and notes in turn; every 25th order's key is a bool;
    payments are keyed by time stamps with a fraction, every other one written as text."""
    docs = []
    for i in range(n):
        kind = ("order", "payment", "ack", "note")[i % 4]
        doc = {"mid": f"m{i:05d}", "kind": kind}
        if kind == "order":
            doc["n"] = True if i % 100 == 0 else i
        elif kind == "payment":
            doc["pay"] = {"seq": i + 0.25 if i % 8 == 1 else f"{i}.0"}
        elif kind == "ack":
            doc["n"] = i - 2  # acknowledges the order just before it
        docs.append(doc)
    return docs


def short_form_events(n: int) -> list[dict]:
    """The demo's orders and payments; every 50th has a key that is no int."""
    return [{**order_or_payment(i), "seq": "late"} if i % 50 == 7 else order_or_payment(i) for i in range(n)]


def replay_of(flow: str, docs: list[dict]) -> tuple[list[str], dict[int, str]]:
    """What replay sends out of the master's graph, and the bad lines (by index) with their reasons."""
    bad: dict[int, str] = {}
    lines = [json.dumps({"at": i * 0.001, **d}) for i, d in enumerate(docs)]
    out = [e["id"] for e in replay(parse_graph(flow), lines, on_bad=lambda n, why: bad.__setitem__(n - 1, why))]
    return out, bad


def held(flow: str, docs: list[dict]) -> tuple[dict, int]:
    """RULE_PEND of a worker that read ``docs`` and saw no claim, and how many left by nohit."""
    rules = parse_graph(flow).cluster.message.claim_rules
    pending, nohit = dict.fromkeys(rules.baking, 0), 0
    for d in docs:
        try:
            claim = rules.classify(d)
        except BadInput:
            continue  # the failure stream's
        if claim is None or claim[0] in rules.claiming:
            nohit += 1
        else:
            pending[claim[0]] += 1
    return {**pending, "nohit": 0}, nohit


def rule_pending(cluster: LocalCluster, peer: str) -> dict:
    return json.loads(cluster.status(peer).get("rule_pending") or "{}")


def longer_session(flow: Path) -> str:
    """The flow file with a ZooKeeper session long enough that a master stopped for a few
    seconds stays master."""
    text = flow.read_text().replace("session_timeout: 2.0", "session_timeout: 10.0")
    assert text != flow.read_text()
    return text


def float_keys(text: str) -> str:
    """A claim flow's text with every ruleset's key read as a float."""
    floated = text.replace("key_type: int", "key_type: float")
    assert floated != text
    return floated


CASES = {  # the flow file as the cluster runs it, its events, the bad ones' reason and number
    "rulesets": (float_keys(longer_session(RULESETS)), rulesets_events(600),
                 "ruleset 'orders': key True is not a float", 6),
    "short-form": (longer_session(SHORT), short_form_events(600), "ruleset 'all': key 'late' is not an int", 12),
}


def run_through_a_master_kill(cluster: LocalCluster, case: str) -> None:
    """The scenario of the module docstring, on ``cluster`` (a flow file of ``longer_session``)."""
    flow, docs, reason, bad_count = CASES[case]
    want, bad = replay_of(flow, docs)
    assert len(bad) == bad_count and all(reason in why for why in bad.values()), bad
    first, second, third = docs[:200], docs[200:400], docs[400:]

    cluster.peer("a")
    cluster.wait_status("a", role="master")
    cluster.peer("b")
    cluster.wait_status("b", role="worker", streaming=1)
    a = cluster.peers["a"].pid

    # 1. The master stops; the worker reads ahead of it and holds each group's messages.
    os.killpg(a, signal.SIGSTOP)
    positions = cluster.publish(first)
    wait_until(lambda: cluster.read_upto("b") == positions[-1], 30, what="b to read the first third")
    pending, nohit = held(flow, first)
    wait_until(lambda: rule_pending(cluster, "b") == pending, 10, what=f"b's RULE_PEND {pending}")
    assert int(cluster.status("b")["nohit"]) == nohit
    over_grpc = peer_status(cluster.status("b")["grpc_address"])  # RULE_PEND in the gRPC status too
    assert over_grpc["rule_pending"] == pending and over_grpc["nohit"] == nohit
    # 2. The master goes on: its escalations claim, each in its own group, all that b holds.
    os.killpg(a, signal.SIGCONT)
    empty = dict.fromkeys(pending, 0)
    wait_until(lambda: rule_pending(cluster, "b") == empty, 30, what="the master's claims to release b's bake")
    st = cluster.status("b")
    assert int(st["claimed"]) == sum(pending.values()) and int(st["rolled_back"]) == 0
    notices = [f for _, f in cluster.stream("unclaimed")]  # a slow claim is surfaced, then closed
    assert sorted(f["id"] for f in notices if f["event"] == "surfaced") == \
        sorted(f["id"] for f in notices if f["event"] == "claimed")

    # 3. The master stops again, the worker holds the second third, and the master dies.
    os.killpg(a, signal.SIGSTOP)
    positions += cluster.publish(second)
    wait_until(lambda: cluster.read_upto("b") == positions[-1], 30, what="b to read the second third")
    wait_until(lambda: rule_pending(cluster, "b") == held(flow, second)[0], 10, what="b's RULE_PEND")
    os.killpg(a, signal.SIGKILL)
    cluster.wait_status("b", role="master", timeout_s=60)
    positions += cluster.publish(third)

    wait_until(lambda: len(cluster.stream("sink")) >= len(want), 60, interval_s=0.5, what=f"{len(want)} deliveries")
    settled(lambda: len(cluster.stream("sink")))
    sink = [f["id"] for _, f in cluster.stream("sink")]
    assert sorted(sink) == sorted(want) and len(set(sink)) == len(sink)  # nothing lost, nothing twice
    failures = {f["position"]: f["reason"] for _, f in cluster.stream("failure")}
    assert sorted(failures) == sorted(positions[i] for i in bad)  # once each, whichever peer wrote it
    assert all(reason in why for why in failures.values())
