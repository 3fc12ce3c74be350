"""The alerting rules (deploy/prometheus/twinflow-rules.yml): promtool accepts them, their unit
tests pass and show every rule both firing and silent, and every alert has its runbook section
(docs/operations/runbooks.md) and every section its alert. tests/integration/test_monitoring.py
checks that the rules ask only for metrics a peer serves."""

from __future__ import annotations

import subprocess

import yaml

from tests.monitoring import RULE_TESTS, RULES, alert_rules, runbook_sections, untested

RUNBOOK_URL = "docs/operations/runbooks.md#{}"


def test_promtool_accepts_the_rules(promtool):
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in r.stdout


def test_the_rules_pass_their_unit_tests(promtool):
    r = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_rule_is_tested_firing_and_silent():
    assert len(alert_rules()) >= 15
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
        # The site's anchor of a heading is the heading in lower case (no other characters in it).
        assert rule["annotations"]["runbook_url"] == RUNBOOK_URL.format(name.lower()), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        text = sections[name]
        for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
            assert part in text, f"the runbook of {name} has no {part}"
