"""``twinflow validate``: every refusal of a flow file at once, each with file, line, field and
reason, by the same rules as the loader (each fault alone is exactly what ``parse_graph`` raises),
with the cluster's start checks, and its exit statuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinflow.cli import main
from twinflow.runtime.flowgraph import FlowFileError, check_graph, parse_graph

GOOD = """\
flow: orders
uplink: {stream: uplink}
input: guard
nodes:
  guard:
    type: history
    uuid: uuid
    retention: 3600
    links: {new: match}
  match:
    type: join
    join_type: and
    types: [order, payment]
    type_field: type
    activation_field: order_id
    timeout: 10
    links: {joined: deliver}
  deliver:
    type: action
    sink: {stream: sink}
cluster: {session_timeout: 2.0}
audit: {retention: 7d}
notices: {outlinks: [match.failure]}
streams: {max_entries: 1000000, overrides: {sink: {retention: 30d}}}
"""

# One fault per part the loader reads on its own: (old, new, line, field). Each on a line of its own.
FAULTS = [
    ("flow: orders", "flow: orders\ncolour: blue", 2, "colour"),
    ("retention: 3600", "retention: -1", 8, "nodes.guard.retention"),
    ("links: {joined: deliver}", "links: {joined: deliver, expired: ghost}", 17, "nodes.match.links.expired"),
    ("uplink: {stream: uplink}", "uplink: {stream: uplink, batch_size: 0}", 2, "uplink.batch_size"),
    ("cluster: {session_timeout: 2.0}", "cluster: {session_timeout: 100}", 21, "cluster.session_timeout"),
    ("audit: {retention: 7d}", "audit: {retention: soon}", 22, "audit.retention"),
    ("[match.failure]", "[match.failure, match.lost]", 23, "notices.outlinks[1]"),
    ("retention: 30d}", "retention: 1s}", 24, "streams.overrides.sink.retention"),
]


def test_the_good_flow_has_no_refusal():
    graph, found = check_graph(GOOD, "f.yaml")
    assert found == [] and graph is not None and list(graph.nodes) == ["guard", "match", "deliver"]


@pytest.mark.parametrize("old, new, line, field", FAULTS)
def test_each_fault_alone_is_what_the_loader_refuses(old, new, line, field):
    text = GOOD.replace(old, new)
    with pytest.raises(FlowFileError) as raised:
        parse_graph(text, "f.yaml")
    graph, found = check_graph(text, "f.yaml")
    assert graph is None and [str(e) for e in found] == [str(raised.value)]
    assert (found[0].line, found[0].field) == (line, field)


def test_every_fault_at_once_is_reported_with_its_line():
    text = GOOD
    for old, new, _, _ in FAULTS:
        text = text.replace(old, new)
    lines = text.splitlines()
    graph, found = check_graph(text, "f.yaml")
    assert graph is None
    want = {field for *_, field in FAULTS}
    assert {e.field for e in found} == want
    for e in found:  # each points at the line that holds its fault
        assert e.file == "f.yaml" and e.reason
        key = e.field.rpartition(".")[2].split("[")[0]
        assert key in lines[e.line - 1], (str(e), lines[e.line - 1])


def test_what_depends_on_a_refused_node_is_not_refused_again():
    # guard's own parameters are refused: its links and the notice naming it are not checked.
    text = GOOD.replace("retention: 3600", "retention: -1").replace("links: {new: match}", "links: {newer: match}")
    text = text.replace("[match.failure]", "[guard.lost]")
    _, found = check_graph(text, "f.yaml")
    assert [e.field for e in found] == ["nodes.guard.retention"]


def test_a_file_that_is_not_yaml_is_one_refusal():
    graph, found = check_graph("flow: [\n", "f.yaml")
    assert graph is None and len(found) == 1 and "not valid YAML" in found[0].reason


def run(capsys, *args) -> tuple[int, str]:
    code = main(["validate", *args])
    return code, capsys.readouterr().out


def test_exit_0_and_one_ok_line_when_nothing_is_refused(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    example = Path(__file__).parents[1] / "examples" / "cluster.yaml"
    code, out = run(capsys, str(good), str(example))
    assert (code, out) == (0, "ok: 2 flow files, no refusals\n")


def test_exit_2_with_each_refusal_on_a_line_then_the_count(tmp_path, capsys):
    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text(GOOD.replace("retention: 3600", "retention: -1")
                   .replace("session_timeout: 2.0", "session_timeout: 100"))
    good.write_text(GOOD)
    code, out = run(capsys, str(good), str(bad), str(tmp_path / "missing.yaml"))
    assert code == 2
    assert out.splitlines() == [
        f"{bad}:8: nodes.guard.retention: must be seconds > 0 and <= 3.1536e+08 (got -1)",
        f"{bad}:21: cluster.session_timeout: must be seconds in [1, 60] (got 100)",
        f"{tmp_path / 'missing.yaml'}: (file): cannot be read: No such file or directory",
        "3 refusals in 2 of 3 flow files",
    ]


def test_the_start_checks_of_twinflow_run_are_reported_unless_replay(tmp_path, capsys):
    replay_only = tmp_path / "replay.yaml"
    replay_only.write_text("flow: f\nnodes:\n  a: {type: history, uuid: u, retention: 60, completion: external}\n")
    code, out = run(capsys, "--json", str(replay_only))
    report = json.loads(out)
    assert code == 2 and report["ok"] is False and report["files"] == 1
    assert report["errors"] == [{"file": str(replay_only), "line": 1, "field": "uplink",
                                 "reason": "flow 'f' has no uplink section, so it runs in replay only "
                                           "(docs/reference/flow-file.md)"}]
    assert run(capsys, "--replay", str(replay_only)) == (0, "ok: 1 flow file, no refusals (checked for replay)\n")
    on_cluster = tmp_path / "external.yaml"
    on_cluster.write_text(replay_only.read_text() + "  b: {type: history, uuid: u, retention: 60, "
                                                    "completion: external}\nuplink: {stream: up}\n")
    code, out = run(capsys, "--json", str(on_cluster))
    errors = json.loads(out)["errors"]
    assert code == 2 and [(e["line"], e["field"]) for e in errors] == [(3, "nodes.a"), (4, "nodes.b")]
    assert all("completion: external needs a node linked to its 'new' outlink" in e["reason"] for e in errors)


def test_two_flows_with_a_handlers_module_of_the_same_name_each_get_their_own(tmp_path):
    """One process loading two flows whose folders each hold a ``handlers.py`` (the console,
    ``validate`` of several files): the second flow's handler is its own folder's, not the
    module the first one left cached."""
    from twinflow.runtime.flowgraph import load_graph

    flows = []
    for name, answer in (("one", "first"), ("two", "second")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tf_same_name_handlers.py").write_text(
            f"def deliver(msg):\n    return {answer!r}\n\n\ndef only_in_{name}(msg):\n    return None\n")
        (folder / "flow.yaml").write_text(
            "flow: f\nnodes:\n"
            '  deliver: {type: action, handler: "tf_same_name_handlers:deliver"}\n'
            f'  other: {{type: action, handler: "tf_same_name_handlers:only_in_{name}"}}\n')
        flows.append(load_graph(folder / "flow.yaml"))
    handlers = [graph.nodes["deliver"].handler(None) for graph in flows]
    assert handlers == ["first", "second"]
