"""The flow file's ``streams`` section: every stream the flow writes has bounds, read with their
defaults and overrides, and every bad value is refused at load naming the file, line, field and
reason."""

import pytest

from tests.test_cluster_flow_file import assert_refused
from twinflow.cluster.master_flow import outlink_streams
from twinflow.cluster.on_cluster import flow_keys
from twinflow.runtime.flowgraph import FlowFileError, parse_graph
from twinflow.runtime.stream_spec import Retention, written_streams

FLOW = """\
flow: f1
uplink: {stream: up}
input: guard
nodes:
  guard: {type: history, uuid: u, retention: 60, links: {new: act}}
  act: {type: action, sink: {stream: deliveries}}
failure: {max_entries: 500}
"""


def test_every_stream_the_flow_writes_is_named_by_its_stream_and_by_its_outlink():
    graph = parse_graph(FLOW)
    names = written_streams(graph.nodes, graph.links)
    assert names["act.done"] == names["deliveries"] == "deliveries"
    assert names["guard.duplicate"] == names["out:guard:duplicate"] == "out:guard:duplicate"
    assert (names["failure"], names["notices"]) == ("failure", "notices")
    assert "guard.new" not in names  # linked: nothing leaves the flow there
    # The same streams the master writes to.
    keys = flow_keys(graph)
    assert set(outlink_streams(graph, keys).values()) == {keys.prefix + s for s in set(names.values())} - {
        keys.failure, keys.notices}


def test_defaults_bound_every_stream_by_count_and_age():
    spec = parse_graph(FLOW).cluster.streams
    assert spec.of("deliveries") == Retention(1_000_000, 7 * 86400.0)
    assert spec.of("failure", cap=500) == Retention(500, 7 * 86400.0)  # the failure stream's own cap is smaller


def test_overrides_by_either_name_and_null_for_one_bound():
    spec = parse_graph(FLOW + """\
streams:
  max_entries: 2000
  retention: 1h
  overrides:
    act.done: {max_entries: 50000, retention: null}
    out:guard:duplicate: {retention: 2d}
    notices: {max_entries: null}
""").cluster.streams
    assert spec.of("deliveries") == Retention(50_000, None)          # count only
    assert spec.of("out:guard:duplicate") == Retention(2000, 172800.0)  # the count inherited
    assert spec.of("notices", cap=10_000) == Retention(10_000, 3600.0)  # its own cap is the count then
    assert spec.of("out:guard:failure") == Retention(2000, 3600.0)


@pytest.mark.parametrize("new, field, reason", [
    ("streams: {max_entries: 0}", "streams.max_entries", "must be 1..100000000, or null"),
    ("streams: {max_entries: 1.5}", "streams.max_entries", "must be a int"),
    ("streams: {max_entries: true}", "streams.max_entries", "must be a int"),
    ("streams: {retention: soon}", "streams.retention", "must be seconds, or a number with s, m, h or d"),
    ("streams: {retention: 30}", "streams.retention", "in [60 s, 3650 d]"),
    ("streams: {retention: 4000d}", "streams.retention", "in [60 s, 3650 d]"),
    ("streams: {max_entries: null, retention: null}", "streams.max_entries", "cannot both be null"),
    ("streams: {keep: 1}", "streams.keep", "unknown field"),
    ("streams: {overrides: {nowhere: {retention: 1d}}}", "streams.overrides.nowhere",
     "is not a stream this flow writes (its streams: deliveries, failure, notices, out:act:error, "
     "out:act:failure, out:guard:duplicate, out:guard:failure, out:guard:in_doubt; an outlink's is also named "
     "<node>.<outlink>)"),
    ("streams: {overrides: {guard.new: {retention: 1d}}}", "streams.overrides.guard.new", "is not a stream"),
    ("streams: {overrides: {deliveries: {}, act.done: {}}}", "streams.overrides.act.done",
     "names stream 'deliveries', which 'deliveries' names too"),
    ("streams: {overrides: {failure: {size: 3}}}", "streams.overrides.failure.size", "unknown field"),
    ("streams: {overrides: {failure: {retention: -1}}}", "streams.overrides.failure.retention", "must be seconds"),
    ("streams: {max_entries: null, overrides: {failure: {retention: null}}}",
     "streams.overrides.failure.retention", "cannot both be null"),
    ("streams: {overrides: [failure]}", "streams.overrides", "must be a mapping"),
])
def test_a_bad_value_is_refused_at_load(new, field, reason):
    assert_refused(FLOW + "#\n", "#\n", new + "\n", 8, field, reason)


def test_the_section_needs_an_uplink():
    with pytest.raises(FlowFileError, match=r"f.yaml:4: streams: only with an uplink section"):
        parse_graph("flow: f\nnodes:\n  a: {type: action}\nstreams: {max_entries: 10}\n", "f.yaml")
