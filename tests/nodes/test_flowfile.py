"""Flow files: the example loads; every bad file is refused naming file, line, field, reason."""

from pathlib import Path

import pytest

from twinflow.runtime.flowfile import FlowFileError, load_flow, parse_flow

GOOD = """\
flow: f1
uplink: {stream: up}
message: {id: id, key: seq}
nodes:
  sort: {type: sort, mode: claim, bake_time: 2}
  act:
    type: action
    sink: {stream: out}
"""


def test_example_flow_loads():
    spec = load_flow(Path(__file__).parents[2] / "examples" / "cluster.yaml")
    assert spec.name == "demo" and spec.sort.bake_time == 5.0 and spec.action.id_ttl == 604800


def test_defaults():
    spec = parse_flow(GOOD)
    assert spec.sort.unclaimed_outlink == "done"
    assert spec.action.id_ttl == 7 * 86400  # the ID cache never grows without bound
    assert spec.session_timeout == 2.0
    # The limits that keep a node safe: bounded batches, a lease below the session, a capped failure stream.
    assert spec.batch_bytes == 64 << 20 and spec.write_lease == 1.0 < spec.session_timeout
    assert (spec.message.max_depth, spec.message.max_number_digits) == (64, 100)
    assert spec.redis_checks == "refuse" and spec.wait_replicas == 0
    assert spec.failure_max_entries == 100_000


def test_the_new_limits_are_read():
    spec = parse_flow(GOOD.replace("message: {id: id, key: seq}",
                                   "message: {id: id, key: seq, max_depth: 8, max_number_digits: 20}")
                      + "cluster: {session_timeout: 4, write_lease: 3, wait_replicas: 1, redis_checks: warn}\n"
                      + "failure: {max_entries: 500}\n")
    assert (spec.message.max_depth, spec.message.max_number_digits) == (8, 20)
    assert (spec.write_lease, spec.wait_replicas, spec.redis_checks) == (3.0, 1, "warn")
    assert spec.failure_max_entries == 500


@pytest.mark.parametrize("old, new, line, field, reason", [
    ("bake_time: 2", "bake_time: 0", 5, "nodes.sort.bake_time", "must be seconds"),
    ("bake_time: 2", "bake_time: soon", 5, "nodes.sort.bake_time", "must be a int or float"),
    ("mode: claim", "mode: static", 5, "nodes.sort.mode", "only 'claim'"),
    ("message: {id: id, key: seq}", "message: {id: id}", 3, "message.key", "is required"),
    ("uplink: {stream: up}", "uplink: {stream: up, extra: 1}", 2, "uplink.extra", "unknown field"),
    ("flow: f1", "flow: 'has space'", 1, "flow", "letters, digits"),
    ("    type: action", "    type: teleport", 7, "nodes.act.type", "must be 'sort' or 'action'"),
    ("    sink: {stream: out}", "    sink: {}", 8, "nodes.act.sink.stream", "is required"),
    ("uplink: {stream: up}", "uplink: {stream: up, batch_bytes: 100}", 2, "uplink.batch_bytes", "1-256 MiB"),
    ("uplink: {stream: up}\nmessage: {id: id, key: seq}",
     "uplink: {stream: up, batch_bytes: 2097152}\nmessage: {id: id, key: seq, max_bytes: 4194304}", 2,
     "uplink.batch_bytes", "at least message.max_bytes"),
    ("message: {id: id, key: seq}", "message: {id: id, key: seq, max_depth: 0}", 3, "message.max_depth", "1..1000"),
    ("flow: f1", "flow: f1\ncluster: {write_lease: 2}", 2, "cluster.write_lease", "session_timeout"),
    ("flow: f1", "flow: f1\ncluster: {redis_checks: maybe}", 2, "cluster.redis_checks", "refuse, warn"),
])
def test_bad_field_is_refused_with_line_field_and_reason(old, new, line, field, reason):
    text = GOOD.replace(old, new)
    assert text != GOOD
    with pytest.raises(FlowFileError) as err:
        parse_flow(text, "bad.yaml")
    e = err.value
    assert (e.file, e.line, e.field) == ("bad.yaml", line, field), str(e)
    assert reason in e.reason
    assert str(e).startswith(f"bad.yaml:{line}: {field}: ")


def test_broken_yaml_and_missing_file():
    with pytest.raises(FlowFileError, match="not valid YAML"):
        parse_flow("flow: [\n", "x.yaml")
    with pytest.raises(FlowFileError, match="cannot be read"):
        load_flow("/nonexistent/flow.yaml")


def test_cluster_flow_needs_one_sort_and_one_action():
    text = GOOD.replace("  sort: {type: sort, mode: claim, bake_time: 2}\n", "")
    with pytest.raises(FlowFileError, match="exactly one sort and one action"):
        parse_flow(text)
