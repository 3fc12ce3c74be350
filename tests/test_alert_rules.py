"""The alerting rules (deploy/prometheus/twinflow-rules.yml): promtool accepts them, their unit
tests pass and show every rule both firing and silent, every alert has its runbook section
(docs/operations/runbooks.md) and every section its alert, every ``runbook_url`` is the page's one
documented base and the anchor of a section, the page's command moves that base in both files,
and every metric a peer serves is either an alert's or says why it needs none.
tests/integration/test_monitoring.py checks that the rules ask only for metrics a peer serves."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.monitoring import (ROOT, RULE_TESTS, RULES, alert_rules, markdown_table, metric_names, runbook_anchors,
                              runbook_base, runbook_sections, shell_blocks, untested)

METRICS_PAGE = ROOT / "docs" / "reference" / "metrics.md"


def test_promtool_accepts_the_rules(promtool):
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in r.stdout


def test_the_rules_pass_their_unit_tests(promtool):
    r = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_rule_is_tested_firing_and_silent():
    assert len(alert_rules()) >= 30
    assert untested(alert_rules(), yaml.safe_load(RULE_TESTS.read_text())) == {}


def test_a_rule_without_a_firing_case_is_caught():
    tests = yaml.safe_load(RULE_TESTS.read_text())
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            if check["alertname"] == "TwinflowRedisDown":
                check["exp_alerts"] = []
    assert untested(alert_rules(), tests) == {"TwinflowRedisDown": ["firing"]}


def test_every_alert_has_its_runbook_section_and_every_section_its_alert():
    alerts = [rule["alert"] for rule in alert_rules()]
    assert len(alerts) == len(set(alerts))
    sections = runbook_sections()
    runbooks = {title for title in sections if title.startswith("Twinflow")}
    assert runbooks == set(alerts)
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        text = sections[name]
        for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
            assert part in text, f"the runbook of {name} has no {part}"


def test_every_runbook_url_is_the_documented_base_and_an_anchor_of_the_page():
    base = runbook_base()
    assert base == "https://twinflow.example/docs/operations/runbooks/"
    anchors = runbook_anchors()
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(base + "#"), f"{rule['alert']}: {url}"
        anchor = url[len(base) + 1:]
        assert anchors.get(anchor) == rule["alert"], f"{rule['alert']}: #{anchor} is not its section"
    # The unit tests expect the same links (promtool compares them): one base in both files.
    bases = set(re.findall(r"runbook_url: (\S+)#", RULES.read_text() + RULE_TESTS.read_text()))
    assert bases == {base}


def test_the_pages_command_moves_the_base_in_the_rules_and_their_tests(promtool, tmp_path):
    block = next(b for b in shell_blocks(runbook_sections()["Runbook links"]) if "sed -i" in b)
    shutil.copy(RULES, tmp_path / RULES.name)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    env = {**os.environ, "PATH": f"{Path(promtool).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["sh", "-ec", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    new_base = re.search(r"^BASE=(\S+)$", block, re.M).group(1)
    moved = yaml.safe_load((tmp_path / RULES.name).read_text())
    urls = [rule["annotations"]["runbook_url"] for group in moved["groups"] for rule in group["rules"]]
    assert len(urls) == len(alert_rules()) and all(url.startswith(new_base + "#") for url in urls)
    assert runbook_base() not in (tmp_path / RULES.name).read_text() + (tmp_path / RULE_TESTS.name).read_text()


def test_every_metric_served_has_its_alert_or_says_why_none():
    """The runbook page's table: every metric of the metrics page is in it; each alert it names
    exists and asks for a metric of that row; a row without an alert gives its reason; every rule
    is in some row."""
    rows = markdown_table(runbook_sections()["Metrics and their alerts"])
    listed = set(re.findall(r"^\| `(twinflow_[a-z_]+)` \|", METRICS_PAGE.read_text(), re.M))
    in_table: set[str] = set()
    named: set[str] = set()
    rules = {rule["alert"]: metric_names(rule["expr"]) | ({"up"} if re.search(r"\bup\b", rule["expr"]) else set())
             for rule in alert_rules()}
    for metrics_cell, alerts_cell, why in rows:
        metrics = set(re.findall(r"`([a-z_]+)`", metrics_cell))
        in_table |= metrics
        alerts = re.findall(r"`(Twinflow\w+)`", alerts_cell)
        if not alerts:
            assert alerts_cell == "none" and why, f"{metrics_cell}: no alert and no reason"
        for alert in alerts:
            assert alert in rules, f"{metrics_cell} names {alert}, which is no rule"
            assert rules[alert] & metrics, f"{alert} asks for none of {sorted(metrics)}"
        named |= set(alerts)
    assert listed - in_table == set()
    assert set(rules) - named == set()
