"""Join node (webMethods join conditions): AND, OR, XOR with a fake clock, flow-file refusals, properties, examples."""

from __future__ import annotations

import doctest
import json
from collections import Counter
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.nodes import join
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.join import AndJoin, OrJoin, XorJoin, build
from twinflow.runtime.params import Doc, FlowFileError, Params
from twinflow.runtime.replay import replay

EXAMPLES = Path(__file__).parents[2] / "examples"
ABSENT = object()  # a field the generated message leaves out


def m(mid: str, kind=ABSENT, act=ABSENT) -> Msg:
    doc = {"id": mid}
    if kind is not ABSENT:
        doc["type"] = kind
    if act is not ABSENT:
        doc["act"] = act
    return Msg(mid, doc)


def routes(emits) -> list[tuple[str, list[str]]]:
    return [(e.outlink, [x.id for x in e.msgs]) for e in emits]


def and_join(types=("A", "B", "C"), timeout=10.0, duplicate="keep_first") -> AndJoin:
    return AndJoin("j", types, activation_field="act", timeout=timeout, duplicate=duplicate)


def xor_join(types=("A", "B"), timeout=10.0) -> XorJoin:
    return XorJoin("j", types, activation_field="act", timeout=timeout)


def test_docstring_examples():
    result = doctest.testmod(join)
    assert result.attempted > 0 and result.failed == 0


# -- AND ------------------------------------------------------------------
def test_and_joins_one_of_each_type_in_listed_order_whatever_the_arrival_order():
    node = and_join()
    assert node.on_message(m("c", "C", 1), 0.0) == []
    assert node.on_message(m("a", "A", 1), 1.0) == []
    assert node.pending() == 2 and node.activations() == 1 and node.next_deadline() == 10.0
    [emit] = node.on_message(m("b", "B", 1), 2.0)
    assert routes([emit]) == [("joined", ["a", "b", "c"])] and emit.info == {"activation": 1}
    assert node.pending() == 0 and node.next_deadline() is None


def test_and_activations_are_independent_and_string_7_is_not_integer_7():
    node = and_join(types=("A", "B"))
    node.on_message(m("a7", "A", 7), 0.0)
    node.on_message(m("as", "A", "7"), 0.0)
    assert node.on_message(m("bs", "B", "7"), 1.0)[0].msgs[0].id == "as"
    assert routes(node.on_message(m("b7", "B", 7), 1.0)) == [("joined", ["a7", "b7"])]


def test_and_time_out_sends_the_incomplete_group_to_expired():
    node = and_join()
    node.on_message(m("a", "A", "x"), 100.0)
    node.on_message(m("b", "B", "x"), 104.0)
    assert node.on_time(109.9) == []
    [emit] = node.on_time(110.0)
    assert routes([emit]) == [("expired", ["a", "b"])]
    assert emit.info == {"activation": "x", "missing": ["C"]}
    assert node.pending() == 0 and node.activations() == 0 and node.next_deadline() is None


def test_and_message_at_the_exact_time_out_is_late_and_starts_a_new_group():
    node = and_join(types=("A", "B"))
    node.on_message(m("a", "A", "x"), 0.0)
    # The engine did not tick: the arrival fires the due time-out first.
    assert routes(node.on_message(m("b", "B", "x"), 10.0)) == [("expired", ["a"])]
    assert node.pending() == 1 and node.next_deadline() == 20.0  # b started a new time-out
    assert routes(node.on_message(m("a2", "A", "x"), 19.0)) == [("joined", ["a2", "b"])]


def test_and_deadlines_fire_in_time_order():
    node = and_join(types=("A", "B"))
    node.on_message(m("x", "A", "x"), 0.0)
    node.on_message(m("y", "B", "y"), 1.0)
    node.on_message(m("z", "A", "z"), 2.0)
    assert routes(node.on_time(11.5)) == [("expired", ["x"]), ("expired", ["y"])]
    assert node.next_deadline() == 12.0


def test_and_second_instance_of_a_waiting_type_is_discarded_by_default():
    node = and_join(types=("A", "B"))
    node.on_message(m("a1", "A", "x"), 0.0)
    [emit] = node.on_message(m("a2", "A", "x"), 3.0)
    assert routes([emit]) == [("discarded", ["a2"])] and emit.info["activation"] == "x"
    assert "already waiting" in emit.info["reason"]
    assert node.next_deadline() == 10.0  # the time-out is not restarted
    assert routes(node.on_message(m("b", "B", "x"), 4.0)) == [("joined", ["a1", "b"])]


def test_and_keep_last_replaces_the_waiting_instance_without_restarting_the_time_out():
    node = and_join(types=("A", "B"), duplicate="keep_last")
    node.on_message(m("a1", "A", "x"), 0.0)
    [emit] = node.on_message(m("a2", "A", "x"), 3.0)
    assert routes([emit]) == [("discarded", ["a1"])] and "replaced" in emit.info["reason"]
    assert node.pending() == 1 and node.next_deadline() == 10.0
    assert routes(node.on_time(10.0)) == [("expired", ["a2"])]


def test_time_never_runs_backwards_inside_the_node():
    node = and_join(types=("A", "B"))
    node.on_message(m("a", "A", "x"), 5.0)
    node.on_message(m("c", "A", "y"), 1.0)  # an earlier now counts as 5.0
    assert routes(node.on_message(m("b", "B", "x"), 6.0)) == [("joined", ["a", "b"])]
    assert node.next_deadline() == 15.0
    assert node.on_time(14.0) == [] and routes(node.on_time(15.0)) == [("expired", ["c"])]


# -- OR -------------------------------------------------------------------
def test_or_passes_every_listed_message_at_once_without_reading_an_activation():
    node = OrJoin("j", ["A", "B"])
    assert routes(node.on_message(m("a1", "A"), 0.0)) == [("passed", ["a1"])]
    assert routes(node.on_message(m("a2", "A"), 0.0)) == [("passed", ["a2"])]
    assert routes(node.on_message(m("b", "B", [1]), 0.0)) == [("passed", ["b"])]
    assert node.pending() == 0 and node.next_deadline() is None and node.on_time(1e9) == []


# -- XOR ------------------------------------------------------------------
def test_xor_first_passes_the_rest_of_the_window_is_discarded_then_a_new_window():
    node = xor_join()
    [first] = node.on_message(m("a", "A", "x"), 0.0)
    assert routes([first]) == [("passed", ["a"])] and first.info == {"activation": "x"}
    [blocked] = node.on_message(m("b", "B", "x"), 9.9)
    assert routes([blocked]) == [("discarded", ["b"])] and blocked.info == {"activation": "x", "until": 10.0}
    assert routes(node.on_message(m("y", "B", "y"), 9.9)) == [("passed", ["y"])]
    assert routes(node.on_message(m("b2", "B", "x"), 10.0)) == [("passed", ["b2"])]
    assert routes(node.on_message(m("a2", "A", "x"), 19.0)) == [("discarded", ["a2"])]
    assert node.pending() == 0  # XOR holds no message, only windows


def test_xor_windows_close_at_their_time_out_emitting_nothing():
    node = xor_join()
    node.on_message(m("a", "A", "x"), 0.0)
    # A deadline although closing emits nothing: the window's state must go (on the
    # cluster, its entry in Redis), with or without a later message.
    assert node.next_deadline() == 10.0 and node.activations() == 1
    assert node.on_time(10.0) == [] and node.activations() == 0 and node.next_deadline() is None


def test_xor_over_one_type_dedupes_per_activation():
    node = xor_join(types=("alert",))
    out = [node.on_message(m(f"m{i}", "alert", host), t)[0].outlink
           for i, (host, t) in enumerate([("db", 0), ("db", 1), ("web", 2), ("db", 9), ("db", 10)])]
    assert out == ["passed", "discarded", "passed", "discarded", "passed"]


def test_xor_of_documenta_and_documenta_as_the_seed_writes_it():
    # webMethods: "a condition that specified documentA and documentA ... should process one and only
    # one documentA with a particular activation ID during the join time-out period. Integration
    # Server discards any other documentA documents with the same activation ID as the first one."
    graph = parse_graph("""
flow: once
nodes:
  j: {type: join, join_type: xor, types: [documentA, documentA], activation_field: act, timeout: 10}
""")
    lines = [{"at": 0.0, "id": "a1", "type": "documentA", "act": 7},
             {"at": 1.0, "id": "a2", "type": "documentA", "act": 7},
             {"at": 2.0, "id": "b1", "type": "documentA", "act": 8},
             {"at": 9.5, "id": "a3", "type": "documentA", "act": 7},
             {"at": 10.0, "id": "a4", "type": "documentA", "act": 7},   # the time-out elapsed: a new window
             {"at": 11.0, "id": "x1", "type": "documentB", "act": 7}]
    out = [(e["id"], e["outlink"]) for e in replay(graph, [json.dumps(d) for d in lines])]
    assert out == [("a1", "passed"), ("a2", "discarded"), ("b1", "passed"), ("a3", "discarded"),
                   ("a4", "passed"), ("x1", "nohit")]
    assert graph.nodes["j"].types == ("documentA",)


@pytest.mark.parametrize("join_type, extra", [("and", "activation_field: k\ntimeout: 5"), ("or", "")])
def test_only_xor_may_list_a_type_twice(join_type, extra):
    doc = Doc(f"join_type: {join_type}\ntypes: [A, B, A]\n{extra}\n", "f.yaml")
    with pytest.raises(FlowFileError, match="'A' is listed twice .*only an xor join may repeat a type"):
        build("j", Params(doc, "", doc.value))


def test_xor_unlisted_type_with_an_open_activation_is_nohit_not_discarded():
    node = xor_join()
    node.on_message(m("a", "A", "x"), 0.0)
    [emit] = node.on_message(m("z", "Z", "x"), 1.0)
    assert routes([emit]) == [("nohit", ["z"])] and emit.info == {"type": "Z"}


# -- bad input ------------------------------------------------------------
@pytest.mark.parametrize("make", [and_join, xor_join, lambda: OrJoin("j", ["A", "B"])], ids=["and", "xor", "or"])
@pytest.mark.parametrize("kind, reason", [
    (ABSENT, "message has no field 'type'"),
    (7, "field 'type' (the message type) must be a string, not int"),
    (None, "field 'type' (the message type) must be a string, not NoneType"),
])
def test_bad_type_field_goes_to_failure_and_the_node_keeps_running(make, kind, reason):
    node = make()
    assert [(e.outlink, e.info) for e in node.on_message(m("bad", kind, "x"), 0.0)] == [("failure", {"reason": reason})]
    assert node.on_message(m("z", "Z", "x"), 0.0)[0].outlink == "nohit"
    out = node.on_message(m("ok", "A", "x"), 0.0)
    if isinstance(node, AndJoin):  # held until its group completes
        assert out == [] and node.pending() == 1
    else:
        assert routes(out) == [("passed", ["ok"])]


@pytest.mark.parametrize("make", [and_join, xor_join], ids=["and", "xor"])
@pytest.mark.parametrize("act, reason", [
    (ABSENT, "message has no field 'act'"),
    (1.5, "must be a string or an integer, not float"),
    (True, "must be a string or an integer, not bool"),
    ({"k": 1}, "must be a string or an integer, not dict"),
])
def test_bad_activation_goes_to_failure(make, act, reason):
    node = make()
    [emit] = node.on_message(m("bad", "A", act), 0.0)
    assert emit.outlink == "failure" and emit.info["reason"].endswith(reason)
    assert node.activations() == 0 and node.pending() == 0


def test_field_paths_reach_nested_values_list_items_and_any_mapping():
    node = AndJoin("j", ["A", "B"], type_field="/meta/kind", activation_field="refs.0", timeout=5.0)
    node.on_message(Msg("a", {"meta": {"kind": "A"}, "refs": ["r1"]}), 0.0)
    b = Msg("b", MappingProxyType({"meta": MappingProxyType({"kind": "B"}), "refs": ("r1",)}))
    assert routes(node.on_message(b, 1.0))[0][0] == "failure"  # a tuple is not a JSON list
    b = Msg("b", MappingProxyType({"meta": MappingProxyType({"kind": "B"}), "refs": ["r1"]}))
    assert routes(node.on_message(b, 1.0)) == [("joined", ["a", "b"])]


def test_unlisted_type_is_routed_before_the_activation_is_read():
    assert xor_join().on_message(m("z", "Z"), 0.0)[0].outlink == "nohit"


# -- flow-file parameters -------------------------------------------------
def params(body: str) -> Params:
    doc = Doc("nodes:\n  j:\n" + "".join(f"    {line}\n" for line in body.strip().splitlines()), "f.yaml")
    return Params(doc, "nodes.j", doc.value["nodes"]["j"])


def test_build_defaults_and_each_join_type():
    node = build("j", params("types: [A, B]\nactivation_field: order.id\ntimeout: 5"))
    assert isinstance(node, AndJoin) and node.duplicate == "keep_first" and node.timeout == 5.0
    assert node.type_field.parts == ("type",) and node.activation_field.parts == ("order", "id")
    assert isinstance(build("j", params("join_type: or\ntypes: [A]\ntype_field: /meta/kind")), OrJoin)
    xor = build("j", params("join_type: xor\ntypes: [A]\nactivation_field: k\ntimeout: 0.5"))
    assert isinstance(xor, XorJoin) and xor.timeout == 0.5
    last = build("j", params("types: [A, B]\nactivation_field: k\ntimeout: 1\nduplicate: keep_last"))
    assert last.duplicate == "keep_last"
    assert {"joined", "expired", "discarded", "nohit", "failure"} == set(node.outlinks)


@pytest.mark.parametrize("body, line, field, reason", [
    ("types: [A, B]\nactivation_field: k\ntimeout: 5\nwindow: 3", 6, "nodes.j.window", "unknown field"),
    ("join_type: nand\ntypes: [A, B]\nactivation_field: k\ntimeout: 5", 3, "nodes.j.join_type",
     "must be one of and, or, xor"),
    ("activation_field: k\ntimeout: 5", 3, "nodes.j.types", "is required"),
    ("types: []\nactivation_field: k\ntimeout: 5", 3, "nodes.j.types", "must list at least one value"),
    ("types: [A, '']\nactivation_field: k\ntimeout: 5", 3, "nodes.j.types[1]", "non-empty string"),
    ("types:\n  - A\n  - B\n  - A\nactivation_field: k\ntimeout: 5", 6, "nodes.j.types[2]", "'A' is listed twice"),
    ("types: [A]\nactivation_field: k\ntimeout: 5", 3, "nodes.j.types", "use join_type: xor"),
    ("types: [A, B]\ntimeout: 5", 3, "nodes.j.activation_field", "is required"),
    ("types: [A, B]\nactivation_field: ''\ntimeout: 5", 4, "nodes.j.activation_field", "empty field path"),
    ("types: [A, B]\nactivation_field: k", 3, "nodes.j.timeout", "is required"),
    ("types: [A, B]\nactivation_field: k\ntimeout: 0", 5, "nodes.j.timeout", "must be seconds > 0"),
    ("types: [A, B]\nactivation_field: k\ntimeout: soon", 5, "nodes.j.timeout", "(got 'soon')"),
    ("types: [A, B]\nactivation_field: k\ntimeout: 5\nduplicate: newest", 6, "nodes.j.duplicate",
     "keep_first, keep_last"),
    ("join_type: or\ntypes: [A]\ntimeout: 5", 5, "nodes.j.timeout", "has no effect when join_type is or"),
    ("join_type: or\ntypes: [A]\nactivation_field: k", 5, "nodes.j.activation_field", "no activation ID"),
    ("join_type: xor\ntypes: [A]\nactivation_field: k\ntimeout: 5\nduplicate: keep_last", 7,
     "nodes.j.duplicate", "has no effect when join_type is xor"),
    ("types: [A, B]\ntype_field: 3\nactivation_field: k\ntimeout: 5", 4, "nodes.j.type_field", "must be a str"),
])
def test_build_refuses_bad_parameters_naming_file_line_field_and_reason(body, line, field, reason):
    with pytest.raises(FlowFileError) as err:
        build("j", params(body))
    assert (err.value.file, err.value.line, err.value.field) == ("f.yaml", line, field)
    assert reason in err.value.reason


# -- properties -----------------------------------------------------------
TIMEOUT = 2.5
NODES = {
    "and3-first": lambda: and_join(("A", "B", "C"), TIMEOUT, "keep_first"),
    "and2-last": lambda: and_join(("A", "B"), TIMEOUT, "keep_last"),
    "xor2": lambda: xor_join(("A", "B"), TIMEOUT),
    "xor1": lambda: xor_join(("A",), TIMEOUT),
    "or": lambda: OrJoin("j", ["A", "B"]),
}
# Steps land exactly on time-outs often (sums of 0.25, 1, 2.5 are exact floats).
# Mostly good messages close together, so that groups complete, collide and expire;
# a "story" sends one activation's types in some order, so that AND groups complete.
DT = st.sampled_from([0.0, 0.0, 0.0, 0.25, 1.0, 2.5])
ACT = st.sampled_from(["x", "y", 3])
MSG = st.tuples(st.just("msg"), DT, st.sampled_from(["A", "B", "C", "Z", ABSENT, 7]),
                st.one_of(ACT, st.sampled_from([ABSENT, 1.5, True])))
TICK = st.tuples(st.just("tick"), st.sampled_from([0.25, 1.0, 2.5]), st.none(), st.none())
STORY = st.tuples(ACT, st.permutations(["A", "B", "C"]), st.lists(DT, min_size=3, max_size=3)).map(
    lambda s: [("msg", dt, kind, s[0]) for kind, dt in zip(s[1], s[2])])
STEPS = st.lists(st.one_of(MSG.map(lambda s: [s]), TICK.map(lambda s: [s]), STORY), max_size=25).map(
    lambda parts: [step for part in parts for step in part])


def run_engine(node, steps):
    """Drive the node like replay does: deadlines fire at their own time, before a message at that time.

    Returns [(time, emit)] in order and {id: (index, time, msg)} for every message sent.
    """
    out, sent, t = [], {}, 0.0

    def fire_until(limit):
        while (d := node.next_deadline()) is not None and d <= limit:
            out.extend((d, e) for e in node.on_time(d))

    for i, (what, dt, kind, act) in enumerate(steps):
        t += dt
        fire_until(t)
        if what == "msg":
            msg = m(f"m{i}", kind, act)
            sent[msg.id] = (i, t, msg)
            out.extend((t, e) for e in node.on_message(msg, t))
    fire_until(float("inf"))
    return out, sent


def valid(node, msg) -> bool:
    """Whether the message carries a listed type and (where read) a usable activation ID."""
    kind, act = msg.doc.get("type"), msg.doc.get("act", ABSENT)
    if kind not in node.types:
        return False
    return isinstance(node, OrJoin) or (isinstance(act, (str, int)) and not isinstance(act, bool))


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(NODES)), steps=STEPS)
def test_every_message_leaves_exactly_once_across_any_interleaving(name, steps):
    node = NODES[name]()
    entered, left, t = [], Counter(), 0.0
    for i, (what, dt, kind, act) in enumerate(steps):
        t += dt
        if what == "tick":
            emits = node.on_time(t)
        else:
            entered.append(f"m{i}")
            emits = node.on_message(m(f"m{i}", kind, act), t)
        assert all(e.outlink in node.outlinks and e.msgs for e in emits)
        left.update(x.id for e in emits for x in e.msgs)
        assert len(entered) - left.total() == node.pending()
        open_ = node.activations() if hasattr(node, "activations") else node.pending()
        assert (node.next_deadline() is None) == (open_ == 0)
    left.update(x.id for e in node.on_time(t + 10 * TIMEOUT) for x in e.msgs)
    assert left == Counter(entered) and node.pending() == 0 and node.next_deadline() is None


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(NODES)), steps=STEPS)
def test_bad_and_unlisted_messages_leave_at_once_through_failure_or_nohit(name, steps):
    node = NODES[name]()
    out, sent = run_engine(node, steps)
    for at, e in out:
        for x in e.msgs:
            if e.outlink in ("failure", "nohit"):
                assert not valid(node, x) and at == sent[x.id][1]
            else:
                assert valid(node, x)
            assert (e.outlink == "nohit") == (isinstance(x.doc.get("type"), str) and x.doc["type"] not in node.types)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["and3-first", "and2-last"]), steps=STEPS)
def test_and_join_holds_one_of_each_type_of_one_activation_within_the_first_ones_time_out(name, steps):
    node = NODES[name]()
    out, sent = run_engine(node, steps)
    for at, e in out:
        if e.outlink not in ("joined", "expired"):
            continue
        arrivals = [sent[x.id] for x in e.msgs]
        assert {x.doc["act"] for x in e.msgs} == {e.info["activation"]}
        kinds = [x.doc["type"] for x in e.msgs]
        start, end = min(t for _, t, _ in arrivals), max(t for _, t, _ in arrivals)
        assert end - start < TIMEOUT
        if e.outlink == "joined":
            assert kinds == list(node.types) and at == end
            continue
        # expired: a partial group, in listed order, at the time-out its first message started
        assert kinds == [k for k in node.types if k in kinds]
        assert e.info["missing"] == [k for k in node.types if k not in kinds]
        # keep_last may have replaced the message that started the time-out
        assert at == start + TIMEOUT if node.duplicate == "keep_first" else at - TIMEOUT <= start
        # nothing that could have completed it arrived after it opened and before the time-out
        opened = min(i for i, _, _ in arrivals)
        for i, t, x in sent.values():
            assert not (i > opened and t < at and valid(node, x) and x.doc["act"] == e.info["activation"]
                        and type(x.doc["act"]) is type(e.info["activation"]) and x.doc["type"] in e.info["missing"])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["xor2", "xor1"]), steps=STEPS)
def test_xor_passes_at_most_one_per_activation_per_window_and_discards_only_inside_one(name, steps):
    node = NODES[name]()
    out, sent = run_engine(node, steps)
    last_pass: dict[tuple, float] = {}
    for at, e in out:
        if e.outlink not in ("passed", "discarded"):
            continue
        [x] = e.msgs
        key = (type(x.doc["act"]), x.doc["act"])
        assert at == sent[x.id][1]
        if e.outlink == "passed":
            assert key not in last_pass or at >= last_pass[key] + TIMEOUT
            last_pass[key] = at
        else:
            assert last_pass[key] <= at < last_pass[key] + TIMEOUT == e.info["until"]


# -- examples -------------------------------------------------------------
EXAMPLE_DIRS = sorted(EXAMPLES.glob("join-*"))


def run_flow(flow: str, events: str) -> list[dict]:
    """What ``twinflow replay`` prints, as dicts."""
    return list(replay(parse_graph(flow), events.splitlines()))


def expected(example: Path) -> list[dict]:
    return [json.loads(line) for line in (example / "expected.jsonl").read_text().splitlines()]


def test_the_examples_cover_every_join_type():
    assert {d.name for d in EXAMPLE_DIRS} >= {"join-and", "join-or", "join-xor", "join-xor-dedupe"}


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda d: d.name)
def test_example_output_matches_expected(example):
    assert run_flow((example / "flow.yaml").read_text(), (example / "events.jsonl").read_text()) == expected(example)


def test_the_reference_page_example_does_what_the_page_says():
    page = (Path(__file__).parents[2] / "docs" / "reference" / "nodes" / "join.md").read_text()
    flow = page.split("```yaml\n")[1].split("```")[0]
    events = page.split("```json\n")[1].split("```")[0]
    assert run_flow(flow, events) == [
        {"at": 3, "node": "complete", "outlink": "joined", "ids": ["o1-order", "o1-pay", "o1-ship"],
         "activation": "o1"},
        {"at": 12, "node": "complete", "outlink": "expired", "id": "o2-order", "activation": "o2",
         "missing": ["payment", "shipment"]},
    ]

