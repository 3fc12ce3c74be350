"""The monitoring files under deploy/ as the tests read them: the alerting rules, their unit
tests, the Grafana dashboard, the runbooks, and the metric names their queries ask for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
RULES = ROOT / "deploy" / "prometheus" / "twinflow-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "twinflow-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "twinflow-dashboard.json"
RUNBOOKS = ROOT / "docs" / "operations" / "runbooks.md"

# A histogram's series carry its name with one of these after it.
HISTOGRAM_SERIES = re.compile(r"_(bucket|count|sum)$")


def alert_rules() -> list[dict]:
    """Every alerting rule of the rules file, in its order."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    """The dashboard's panels, those inside rows too, rows left out."""
    out = []
    for panel in dashboard()["panels"]:
        if panel.get("type") == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]


def as_promql(query: str) -> str:
    """A dashboard query with Grafana's variables replaced by what they stand for."""
    return query.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$flow", ".+")


def metric_names(query: str) -> set[str]:
    """The twinflow metrics ``query`` selects, a histogram's series by the histogram's name."""
    return {HISTOGRAM_SERIES.sub("", name) for name in re.findall(r"\btwinflow_[a-z0-9_]+\b", query)}


def runbook_sections() -> dict[str, str]:
    """The runbook page's sections: heading -> its text."""
    parts = re.split(r"^## (.+?)\s*$", RUNBOOKS.read_text(), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def runbook_anchors() -> dict[str, str]:
    """Each section's anchor on the site (the toc extension's, as mkdocs.yml configures it) -> its heading."""
    from markdown.extensions.toc import slugify

    return {slugify(title, "-"): title for title in runbook_sections()}


def runbook_base() -> str:
    """The base of every alert's ``runbook_url``, as "Runbook links" on the runbook page gives it:
    what its ``sed`` command replaces."""
    found = re.findall(r'sed -i "s\|([^|]+)\|\$BASE\|"', runbook_sections()["Runbook links"])
    assert len(found) == 1, f"the runbook links section's sed command: {found}"
    return found[0]


def shell_blocks(text: str) -> list[str]:
    """The ``sh`` code blocks of a page's text."""
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)


def markdown_table(text: str) -> list[list[str]]:
    """The rows of the first table in ``text``, header and rule left out, each a list of cells."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def untested(rules: list[dict], tests: dict) -> dict[str, list[str]]:
    """Per alert of ``rules``, what its unit tests (``tests``, as the test file holds them)
    lack: a case where it fires, one where it does not."""
    fires, silent = set(), set()
    for case in tests.get("tests", []):
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    out = {}
    for rule in rules:
        lacks = [what for what, seen in (("firing", fires), ("silent", silent)) if rule["alert"] not in seen]
        if lacks:
            out[rule["alert"]] = lacks
    return out
