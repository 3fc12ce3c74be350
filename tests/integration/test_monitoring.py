"""The metrics pages of two real peers (tests/integration/test_metrics.py's pair, after a batch
and its escalation) against the monitoring files: promtool's lint finds nothing on them, and the
dashboard and the alerting rules ask only for metrics the peers serve."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
import uuid

import pytest

from tests.conftest import wait_until
from tests.integration.test_metrics import metric, started_pair
from tests.monitoring import alert_rules, dashboard_queries, metric_names

# What the rules select that a peer of this pair does not serve: Prometheus's own series of a
# target; the clock offset (once a flow clock on Redis's time sampled it; the pair runs on a fake
# clock); the token check's refusals and the certificates' ends (only with tokens and TLS, which
# the pair has not: tests/integration/test_grpc_security.py and tests/test_tls_expiry.py scrape them).
NOT_FROM_THE_PAIR = {"twinflow_clock_offset_seconds", "twinflow_grpc_refused_total", "twinflow_tls_expires_in_seconds"}


@pytest.fixture(scope="module")
def pages(redis_url, zk_hosts, tmp_path_factory):
    """The text of each peer's /metrics page once a batch ran on both and its claims were escalated."""
    flow_name = "t" + uuid.uuid4().hex[:10]
    with started_pair(redis_url, zk_hosts, flow_name, tmp_path_factory.mktemp("peers")) as (peer_a, peer_b, _):
        a, b = peer_a.member, peer_b.member
        bodies = [json.dumps(d).encode() for d in ({"id": "o1", "type": "order", "order_id": 1},
                                                   {"id": "p1", "type": "payment", "order_id": 1})]
        rows = [(p, body, None) for p, body in zip(a.store.publish(bodies), bodies)]
        b.on_batch(0, rows)
        a.on_batch(0, rows)
        A = peer_a.metrics.address
        wait_until(lambda: metric(A, "twinflow_escalation_claims_total", flow=flow_name, peer="a", target="b",
                                  result="acked") == 2, 10.0, what="b to ack the 2 claims")
        out = {}
        for peer in (peer_a, peer_b):
            with urllib.request.urlopen(f"http://{peer.metrics.address}/metrics", timeout=5) as resp:
                out[peer.cfg.peer_id] = resp.read().decode()
        yield out


def families(pages: dict[str, str]) -> set[str]:
    """The metric families the pages declare (``# TYPE``), with or without samples now."""
    return {name for text in pages.values() for name in re.findall(r"^# TYPE (\S+) ", text, re.M)}


def test_promtool_finds_no_problem_in_the_metrics_pages(pages, promtool):
    for peer, text in pages.items():
        assert "twinflow_is_master{" in text and "twinflow_batch_duration_seconds_bucket{" in text
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout + r.stderr == "", f"peer {peer}: {r.stdout}{r.stderr}"


def test_promtool_would_report_a_bad_page(promtool):
    bad = "# HELP twinflow_fenced a counter without _total\n# TYPE twinflow_fenced counter\ntwinflow_fenced 1\n"
    r = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "_total" in r.stdout + r.stderr


def test_the_dashboard_asks_only_for_metrics_the_peers_serve(pages):
    served = families(pages)
    assert len(served) >= 25
    asked = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert asked and asked - served == set()


def test_the_rules_ask_only_for_metrics_the_peers_serve(pages):
    served = families(pages)
    asked = set().union(*(metric_names(rule["expr"]) for rule in alert_rules()))
    assert len(asked) >= 15
    assert asked - served == NOT_FROM_THE_PAIR
