"""The Grafana dashboard (deploy/grafana/twinflow-dashboard.json): a dashboard Grafana can import,
every panel with its queries, every query valid PromQL (promtool reads each one as a recording
rule), and the views operations asks for. tests/integration/test_monitoring.py checks that its
queries ask only for metrics a peer serves."""

from __future__ import annotations

import subprocess

import yaml

from tests.monitoring import as_promql, dashboard, dashboard_panels, dashboard_queries, metric_names

# What the dashboard shows: roles and epochs, lag, messages in and out, batch and timer
# durations, fenced writes, escalations, Redis and ZooKeeper, suspensions, the audit.
SHOWN = {"twinflow_is_master", "twinflow_epoch", "twinflow_role", "twinflow_uplink_lag_seconds", "twinflow_uplink_lag",
         "twinflow_uplink_read_total", "twinflow_outlink_messages_total", "twinflow_batch_duration_seconds",
         "twinflow_timer_lateness_seconds", "twinflow_fenced_total", "twinflow_escalation_claims_total",
         "twinflow_escalation_batches_received_total", "twinflow_redis_up", "twinflow_zookeeper_connected",
         "twinflow_suspended", "twinflow_audit_failed"}


def test_the_dashboard_has_the_shape_grafana_imports():
    d = dashboard()
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "label_values(twinflow_is_master, flow)" in variables["flow"]["definition"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    panels = dashboard_panels()
    assert len(panels) >= 12
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        targets = panel["targets"]
        assert targets, f"panel {panel['title']!r} has no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in targets:
            assert metric_names(target["expr"]), f"{panel['title']!r} asks for no twinflow metric: {target['expr']}"
            assert 'flow=~"$flow"' in target["expr"], f"{panel['title']!r} ignores the flow variable"


def test_every_query_is_promql(promtool, tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query:{n}", "expr": as_promql(q)} for n, q in enumerate(dashboard_queries())]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(dashboard_queries())} rules found" in r.stdout


def test_a_query_that_is_not_promql_is_caught(promtool, tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": "dashboard:query:0", "expr": as_promql('sum by (flow) (rate(twinflow_fenced_total{flow=~"$flow"}))')}]}]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "range vector" in r.stdout + r.stderr


def test_the_dashboard_shows_what_operations_watch():
    used = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert SHOWN - used == set()


def test_histogram_series_are_read_by_the_histogram_name():
    query = ('histogram_quantile(0.9, rate(twinflow_batch_duration_seconds_bucket[5m])) '
             'and on (flow) twinflow_is_master == 1')
    assert metric_names(query) == {"twinflow_batch_duration_seconds", "twinflow_is_master"}
