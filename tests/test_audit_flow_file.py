"""The flow file's ``audit`` and ``notices`` sections: read with their defaults, and every bad
value refused at load naming the file, line, field and reason."""

import pytest

from tests.test_cluster_flow_file import assert_refused
from twinflow.runtime.flowgraph import FlowFileError, parse_graph

FLOW = """\
flow: f1
uplink: {stream: up}
input: route
nodes:
  route: {type: join, join_type: or, types: [a], links: {passed: act}}
  act: {type: action}
"""


def test_defaults_keep_a_week_and_notice_no_outlink_but_the_actions_error():
    spec = parse_graph(FLOW).cluster
    assert (spec.audit.retention, spec.audit.max_entries) == (7 * 86400.0, 100_000)
    assert (spec.notices.outlinks, spec.notices.max_entries) == ((), 10_000)


@pytest.mark.parametrize("retention, seconds", [("90", 90.0), (3600, 3600.0), ("15m", 900.0), ("2h", 7200.0),
                                                 ("7d", 604800.0), (120.5, 120.5)])
def test_retention_takes_seconds_or_a_unit(retention, seconds):
    spec = parse_graph(FLOW + f"audit: {{retention: {retention!r}, max_entries: 50}}\n").cluster
    assert (spec.audit.retention, spec.audit.max_entries) == (seconds, 50)


def test_notices_name_unlinked_outlinks():
    spec = parse_graph(FLOW + "notices: {outlinks: [route.nohit, act.failure, route.nohit], "
                              "max_entries: 20}\n").cluster
    assert spec.notices.outlinks == (("route", "nohit"), ("act", "failure"))  # a repeat counts once
    assert spec.notices.max_entries == 20


@pytest.mark.parametrize("new, field, reason", [
    ("audit: {retention: soon}", "audit.retention", "must be seconds, or a number with s, m, h or d"),
    ("audit: {retention: 10}", "audit.retention", "in [60 s, 3650 d]"),
    ("audit: {retention: 4000d}", "audit.retention", "in [60 s, 3650 d]"),
    ("audit: {retention: -5}", "audit.retention", "must be seconds"),
    ("audit: {retention: true}", "audit.retention", "must be seconds"),
    ("audit: {max_entries: 0}", "audit.max_entries", "must be 1..10000000"),
    ("audit: {max_entries: 5.5}", "audit.max_entries", "must be a int"),
    ("audit: {keep: 1}", "audit.keep", "unknown field"),
    ("notices: {outlinks: [act]}", "notices.outlinks[0]", "must be <node>.<outlink>"),
    ("notices: {outlinks: [nowhere.failure]}", "notices.outlinks[0]", "not a node of this flow"),
    ("notices: {outlinks: [act.lost]}", "notices.outlinks[0]", "has no outlink 'lost'"),
    ("notices: {outlinks: [route.passed]}", "notices.outlinks[0]", "links to 'act'"),
    ("notices: {outlinks: [act.done, 7]}", "notices.outlinks[1]", "non-empty string"),
    ("notices: {outlinks: act.failure}", "notices.outlinks", "must be a list"),
    ("notices: {max_entries: 0}", "notices.max_entries", "must be 1..10000000"),
])
def test_a_bad_value_is_refused_at_load(new, field, reason):
    assert_refused(FLOW + "#\n", "#\n", new + "\n", 7, field, reason)


def test_the_sections_need_an_uplink():
    for section in ("audit: {retention: 7d}", "notices: {max_entries: 5}"):
        with pytest.raises(FlowFileError, match="only with an uplink section"):
            parse_graph("flow: f\nnodes:\n  a: {type: action}\n" + section + "\n")
