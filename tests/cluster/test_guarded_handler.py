"""A handler guarded by the history, with retries and `on_retry_failure: suspend`, on a real pair
(examples/cluster-guarded.yaml and its ledger handler): the suspension stops every peer's
reading, survives a failover, and `twinflow resume` (through a peer's Admin service, or Redis) ends
it, starting with the suspended message.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cluster.harness import cluster_on
from tests.conftest import wait_until
from twinflow.chaos import guarded_drills

pytestmark = pytest.mark.cluster


def sink_ids(cluster) -> list[str]:
    return [e.id for _, entries in cluster.outputs().items() for e in entries if _.endswith(".done")]


def suspended(cluster, peer: str) -> dict:
    raw = cluster.status(peer).get("suspended") or "{}"
    return json.loads(raw)


def test_a_suspension_holds_every_peer_survives_a_failover_and_resume_starts_with_its_message(
        tmp_path, services, flow_name, monkeypatch):
    monkeypatch.setenv("TWINFLOW_LEDGER", "")  # restored after the test: prepare() sets both
    monkeypatch.setenv("TWINFLOW_LEDGER_DELAY_MS", "0")
    ledger = guarded_drills.prepare(tmp_path, delay_ms=0)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = guarded_drills.GUARDED_FLOW.read_text().replace("suspend_for: 30", "suspend_for: 600")
    cluster = cluster_on(services, tmp_path, flow_name, text=text)
    try:
        cluster.peer("a")
        wait_until(lambda: cluster.status("a").get("role") == "master", 90, what="a master")
        cluster.peer("b")
        wait_until(lambda: cluster.status("b").get("streaming") == "1", 90, what="the worker streaming")
        docs = [{"id": f"m{i}", "uuid": f"order-{i}", "seq": i} for i in range(30)]
        cluster.publish(docs[:10])
        wait_until(lambda: len(sink_ids(cluster)) == 10, 60, what="the first ten delivered")

        (ledger / "down").touch()  # every call fails with a transient error from now on
        cluster.publish(docs[10:20])
        wait_until(lambda: suspended(cluster, "a") and suspended(cluster, "b"), 60,
                   what="both peers showing the suspension")
        held = suspended(cluster, "b")["book"]
        assert held["id"] == "m10" and "the ledger is down" in held["reason"]
        assert held["until"] == pytest.approx(held["since"] + 600)

        cluster.publish(docs[20:])
        cluster.peers["a"].kill()  # a failover while suspended: the new master keeps the suspension
        wait_until(lambda: cluster.status("b").get("role") == "master", 60, what="b promoted")
        wait_until(lambda: cluster.status("b").get("role") == "master" and suspended(cluster, "b"), 30,
                   what="the new master suspended")
        assert suspended(cluster, "b")["book"]["since"] == held["since"]
        assert len(sink_ids(cluster)) == 10  # nothing ran past the suspended message

        (ledger / "down").unlink()
        # Through the new master's Admin service (the request lands in Redis all the same).
        r = subprocess.run([sys.executable, "-m", "twinflow.cli", "resume", str(cluster.flow_path),
                            "--peer", cluster.status("b")["grpc_address"], "--by", "ops"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "resuming node book (suspended on message 'm10'" in r.stdout, r
        wait_until(lambda: len(sink_ids(cluster)) == 30, 60, what="every message delivered after the resume")
        delivered = sink_ids(cluster)
        assert delivered[:10] == [d["id"] for d in docs[:10]] and delivered[10] == "m10"
        assert sorted(delivered) == sorted(d["id"] for d in docs)  # each once
        wait_until(lambda: not suspended(cluster, "b"), 30, what="the suspension gone from status")
        verdict = guarded_drills.ledger_verdict(ledger)
        assert verdict["booked"] == 30 and verdict["double_booked"] == 0 and verdict["repeated_calls"] == 0

        r = subprocess.run([sys.executable, "-m", "twinflow.cli", "resume", str(cluster.flow_path),
                            "--redis", cluster.redis_url], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "is not suspended: nothing to resume" in r.stdout
    finally:
        cluster.stop()
