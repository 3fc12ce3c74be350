"""The replay engine and flow graphs: time order, routing, groups, refusals, bad lines."""

from types import SimpleNamespace

import pytest

from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.nodes.base import Emit, Msg, Node
from twinflow.runtime.params import FlowFileError
from twinflow.runtime.replay import Engine, replay

TWO = """\
flow: f
nodes:
  first: {type: action, links: {done: second}}
  second: {type: action}
"""


def test_linked_outlinks_carry_messages_on_at_the_same_time():
    out = list(replay(parse_graph(TWO), ['{"at": 2, "id": "m"}']))
    assert out == [{"at": 2.0, "node": "first", "outlink": "done", "id": "m"},
                   {"at": 2.0, "node": "second", "outlink": "done", "id": "m"}]


class Delay(Node):
    """Holds each message for 5 s; then emits it, or a pair as one group."""

    kind, outlinks = "delay", ("out",)

    def __init__(self, name, group=False):
        super().__init__(name)
        self.held, self.group = [], group

    def on_message(self, msg, now):
        self.held.append((now + 5, msg))
        return []

    def next_deadline(self):
        return self.held[0][0] if self.held else None

    def on_time(self, now):
        due = [m for t, m in self.held if t <= now]
        self.held = [(t, m) for t, m in self.held if t > now]
        if self.group and due:
            return [Emit("out", tuple(due), {"n": len(due)})]
        return [Emit("out", (m,)) for m in due]


def graph_with(node, linked=True):
    g = parse_graph(TWO)
    g.nodes["first"] = node
    g.links["first"] = {"out": "second"} if linked else {}
    return g


def test_deadlines_fire_at_their_own_time_and_before_a_message_at_that_time():
    out = list(replay(graph_with(Delay("first"), linked=False),
                      ['{"at": 0, "id": "a"}', '{"at": 5, "id": "b"}', '{"at": 7}']))
    assert [(o["at"], o["id"]) for o in out] == [(5.0, "a"), (10.0, "b")]


def test_until_stops_the_clock():
    out = list(replay(graph_with(Delay("first"), linked=False), ['{"at": 0, "id": "a"}'], until=4))
    assert out == []


def test_group_emission_travels_on_as_one_message():
    out = list(replay(graph_with(Delay("first", group=True)), ['{"at": 0, "id": "a"}', '{"at": 0, "id": "b"}']))
    assert out[0] == {"at": 5.0, "node": "first", "outlink": "out", "ids": ["a", "b"], "n": 2}
    assert out[1] == {"at": 5.0, "node": "second", "outlink": "done", "id": "a+b"}


def test_bad_lines_are_reported_with_their_number_and_the_run_goes_on():
    bad = []
    lines = ['{"at": 1, "id": "a"}', "{oops", '{"id": "b"}', '{"at": 0, "id": "c"}', '{"at": 2, "name": "x"}',
             '{"at": 2, "id": "d"}']
    out = list(replay(parse_graph(TWO.replace(", links: {done: second}", "")), lines,
                      on_bad=lambda n, why: bad.append((n, why))))
    assert [o["id"] for o in out if o["node"] == "first"] == ["a", "d"]
    assert [n for n, _ in bad] == [2, 3, 4, 5]
    assert "goes back in time" in bad[2][1] and "no field 'id'" in bad[3][1]


def bad_reasons(lines):
    bad = []
    out = list(replay(parse_graph(TWO), lines, on_bad=lambda n, why: bad.append((n, why))))
    return out, bad


@pytest.mark.parametrize("at, reason", [
    ("NaN", "'at' is not a finite number (nan)"),
    ("Infinity", "'at' is not a finite number (inf)"),
    ("-Infinity", "'at' is not a finite number (-inf)"),
    ("1" + "0" * 400, "'at' is too large for a time"),
])
def test_an_at_that_is_not_a_finite_number_is_a_bad_line_not_a_crash(at, reason):
    out, bad = bad_reasons(['{"at": 1, "id": "a"}', '{"at": %s, "id": "b"}' % at, '{"at": 2, "id": "c"}'])
    assert [o["id"] for o in out if o["node"] == "first"] == ["a", "c"]
    assert bad == [(2, reason)]


@pytest.mark.parametrize("raw_id, reason", [
    ("true", "ID field 'id' is not a non-empty string or integer"),
    ("false", "ID field 'id' is not a non-empty string or integer"),
    ("1.5", "ID field 'id' is not a non-empty string or integer"),
    ("null", "ID field 'id' is not a non-empty string or integer"),
    ("[1]", "ID field 'id' is not a non-empty string or integer"),
    ('""', "ID field 'id' is empty"),
])
def test_ids_the_cluster_refuses_are_refused_with_the_reason(raw_id, reason):
    out, bad = bad_reasons(['{"at": 1, "id": %s}' % raw_id])
    assert out == [] and bad == [(1, reason)]


def test_an_integer_id_and_its_decimal_text_are_one_id():
    out, bad = bad_reasons(['{"at": 1, "id": 1}', '{"at": 1, "id": "1"}'])
    assert bad == [] and {o["id"] for o in out} == {"1"}


def test_the_command_names_the_events_file_and_line(tmp_path, capsys):
    from twinflow.cli_tools import cmd_replay

    flow, events = tmp_path / "flow.yaml", tmp_path / "events.jsonl"
    flow.write_text(TWO)
    events.write_text('{"at": 1, "id": "a"}\n{"at": NaN, "id": "b"}\n{"at": 2, "id": true}\n')
    assert cmd_replay(SimpleNamespace(flow=str(flow), events=str(events), until=None)) == 1
    err = capsys.readouterr().err
    assert f"{events}:2: 'at' is not a finite number (nan)" in err
    assert f"{events}:3: ID field 'id' is not a non-empty string or integer" in err


def test_engine_clock_never_goes_back():
    seen = []
    e = Engine(graph_with(Delay("first"), linked=False), seen.append)
    e.feed(Msg("a", {}), 3.0)
    e.advance(100.0)
    e.advance(50.0)
    assert e.now == 100.0 and seen[0]["at"] == 8.0


@pytest.mark.parametrize("text, field, reason", [
    (TWO.replace("type: action}", "type: teleport}"), "nodes.second.type", "must be one of"),
    (TWO.replace("done: second", "nowhere: second"), "nodes.first.links.nowhere", "has no outlink 'nowhere'"),
    (TWO.replace("done: second", "done: third"), "nodes.first.links.done", "not a node of this flow"),
    (TWO.replace("second: {type: action}", "second: {type: action, links: {done: first}}"),
     "nodes.second.links.done", "cycle"),
    ("flow: f\ninput: zz\nnodes:\n  a: {type: action}\n", "input", "must name a node"),
    ("flow: f\nnodes: {}\n", "nodes", "at least one node"),
])
def test_bad_graphs_are_refused_naming_the_field(text, field, reason):
    with pytest.raises(FlowFileError) as err:
        parse_graph(text, "g.yaml")
    assert err.value.field == field and reason in err.value.reason and err.value.line is not None


def test_a_message_the_claim_pair_cannot_read_is_a_bad_line_as_the_cluster_refuses_it():
    """A cluster flow's replay refuses, with the cluster's reason, what the cluster's decode sends to
    its failure stream on both peers: a key or claim ID its ruleset cannot build."""
    from pathlib import Path
    from twinflow.runtime.flowgraph import load_graph

    g = load_graph(Path(__file__).parents[1] / "examples" / "cluster-claim-rulesets.yaml")
    lines = ['{"at": 1, "mid": "a", "kind": "order", "n": 1}',
             '{"at": 2, "mid": "b", "kind": "order", "n": true}',
             '{"at": 3, "mid": "c", "kind": "payment", "pay": {}}',
             '{"at": 4, "mid": "d", "kind": "note"}']
    bad = []
    out = [e["id"] for e in replay(g, lines, on_bad=lambda n, why: bad.append((n, why)))]
    assert out == ["a", "d"]  # a note belongs to no ruleset: the master still delivers it
    assert bad == [(2, "ruleset 'orders': key True is not an int"),
                   (3, "ruleset 'payments': message has no key field 'pay.seq'")]


def test_the_command_ends_with_each_sort_nodes_rule_pending(tmp_path, capsys):
    from pathlib import Path
    from twinflow.cli import main

    example = Path(__file__).parents[1] / "examples" / "sort-claim"
    events = tmp_path / "events.jsonl"
    events.write_text('{"at": 0, "id": "o1", "type": "order", "seq": 1}\n')
    assert main(["replay", str(example / "flow.yaml"), str(events), "--until", "1"]) == 0
    assert 'worker rule_pending {"escalations": 0, "orders": 1, "nohit": 0}' in capsys.readouterr().err
