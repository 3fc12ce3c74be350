"""Sequence node (IBM ACE): a number per group, ending by literal, predicate or time-out.

Also the pieces the Resequence node shares: the predicate and the group timers.
"""

import doctest
import textwrap
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.fields import FieldPath
from twinflow.runtime.nodes import sequence
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.sequence import SEQ_MAX, GroupTimers, Predicate, Timed, truth
from twinflow.runtime.flowgraph import node_params as section_params
from twinflow.runtime.params import Doc, FlowFileError, Params


@lru_cache(maxsize=None)  # parsing YAML dominates the property tests otherwise
def node_params(body: str) -> Params:
    """The parameters of node x in a flow file whose node body is ``body`` (from line 5)."""
    text = "flow: t\nnodes:\n  x:\n    type: sequence\n" + textwrap.indent(textwrap.dedent(body), "    ")
    doc = Doc(text, "f.yaml")
    return section_params(Params(doc, "", doc.value).section("nodes").section("x"))


def make(end="end: {literal: 2}", extra=""):
    return sequence.build("x", node_params(f"group: grp\n{end}\n{extra}"))


def m(grp, mid="m", **fields):
    return Msg(mid, {"grp": grp, **fields})


def numbers(node, msgs, now=0.0):
    return [(e.info["seq"], e.info["last"]) for msg in msgs for e in node.on_message(msg, now)]


def test_docstring_examples():
    result = doctest.testmod(sequence)
    assert result.attempted > 0 and result.failed == 0


# -- numbering ------------------------------------------------------------------

def test_numbers_increase_per_group_and_the_literal_end_starts_a_new_instance():
    node = make()
    assert numbers(node, [m("a"), m("a"), m("b"), m("a"), m("a"), m("b")]) == \
           [(0, False), (1, False), (0, False), (2, True), (0, False), (1, False)]


def test_every_message_leaves_at_once_through_out_with_its_number():
    node = make()
    [emit] = node.on_message(m("a", "m1"), 0.0)
    assert emit.outlink == "out" and emit.msgs[0].id == "m1"
    assert emit.info == {"group": "a", "seq": 0, "last": False}
    assert node.pending() == 0 and node.open_groups == 1


def test_start_literal_and_end_equal_to_start():
    node = make(end="start: -5\nend: {literal: -5}")
    assert numbers(node, [m("a"), m("a")]) == [(-5, True), (-5, True)]
    assert node.open_groups == 0


def test_without_a_group_path_all_messages_share_one_counter():
    node = sequence.build("x", node_params("end: {literal: 9}\n"))
    emits = [node.on_message(Msg(str(i), {"grp": i}), 0.0)[0] for i in range(3)]
    assert [e.info for e in emits] == [{"seq": n, "last": False} for n in range(3)]


def test_predicate_end_closes_the_instance_on_the_matching_message():
    node = make(end="end:\n  predicate: {field: kind, in: [final, abort]}")
    msgs = [m("a", kind="part"), m("a"), m("a", kind="final"), m("a", kind="abort"), m("a", kind="FINAL")]
    assert numbers(node, msgs) == [(0, False), (1, False), (2, True), (0, True), (0, False)]


def test_predicate_instances_still_stop_at_the_top_of_the_range():
    node = make(end=f"start: {SEQ_MAX - 1}\nend:\n  predicate: {{field: last}}")
    assert numbers(node, [m("a"), m("a"), m("a")]) == [(SEQ_MAX - 1, False), (SEQ_MAX, True), (SEQ_MAX - 1, False)]


def test_automatic_end_closes_a_group_after_its_quiet_time():
    node = make(end="end: {automatic: 10}")
    node.on_message(m("a"), 0.0)
    node.on_message(m("a"), 5.0)  # restarts the wait
    assert node.next_deadline() == 15.0
    assert node.on_time(14.9) == [] and node.open_groups == 1
    assert node.on_time(15.0) == [] and node.open_groups == 0  # closing emits nothing
    assert node.next_deadline() is None
    assert numbers(node, [m("a")], now=16.0) == [(0, False)]


def test_overdue_close_happens_before_a_message_even_without_a_tick():
    node = make(end="end: {automatic: 10}")
    node.on_message(m("a"), 0.0)
    assert numbers(node, [m("a")], now=10.0) == [(0, False)]  # closed at 10, then numbered


def test_idle_timeout_closes_a_literal_instance():
    node = make(extra="idle_timeout: 30")
    node.on_message(m("a"), 0.0)
    assert node.next_deadline() == 30.0
    node.on_time(30.0)
    assert node.open_groups == 0


def test_last_message_cancels_the_idle_timer():
    node = make(end="end: {literal: 1}", extra="idle_timeout: 30")
    node.on_message(m("a"), 0.0)
    node.on_message(m("a"), 1.0)
    assert node.next_deadline() is None and node.open_groups == 0


# -- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("doc, reason", [
    ({}, "message has no field 'grp'"),
    ({"grp": None}, "group identifier 'grp' must be a string or an integer (got None)"),
    ({"grp": True}, "group identifier 'grp' must be a string or an integer (got True)"),
    ({"grp": 1.5}, "group identifier 'grp' must be a string or an integer (got 1.5)"),
])
def test_bad_group_goes_to_failure_and_takes_no_number(doc, reason):
    node = make()
    node.on_message(m("a"), 0.0)
    [emit] = node.on_message(Msg("bad", doc), 0.0)
    assert (emit.outlink, emit.info) == ("failure", {"reason": reason})
    assert numbers(node, [m("a")]) == [(1, False)]


def test_integer_and_string_groups_are_different_groups():
    node = make()
    assert numbers(node, [m(1), m("1"), m(1)]) == [(0, False), (0, False), (1, False)]


# -- the predicate --------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (1, True), (0, False), (0.0, False), (-2.5, True),
    ("true", True), ("TrUe", True), ("yes", False), ("", False), (None, False), ([1], False), ({"a": 1}, False),
])
def test_truth_table_of_the_seed(value, expected):
    assert truth(value) is expected


def test_equals_compares_json_types_strictly():
    is_one = Predicate(FieldPath("v"), (1,))
    assert is_one({"v": 1}) and is_one({"v": 1.0})
    assert not is_one({"v": True}) and not is_one({"v": "1"}) and not is_one({})
    is_null = Predicate(FieldPath("v"), (None,))
    assert is_null({"v": None}) and not is_null({})


# -- group timers ---------------------------------------------------------------

def timed(groups, *keys):
    for key in keys:
        groups[key] = Timed(key)
    return [groups[key] for key in keys]


def test_group_timers_fire_in_time_order_after_moves_and_cancels():
    groups = {}
    timers = GroupTimers(groups.get)
    a, b, c = timed(groups, "a", "b", "c")
    timers.set(a, 5.0)
    timers.set(b, 3.0)
    timers.set(a, 9.0)   # later: no push, the old entry is re-pushed when it surfaces
    timers.set(c, 1.0)
    timers.cancel(c)
    timers.set(b, 2.0)   # earlier: pushed
    assert timers.next() == 2.0
    assert [timers.pop(100.0) for _ in range(3)] == [(2.0, b), (9.0, a), None]
    timers.set(a, 4.0)   # a group can come back after firing
    assert timers.pop(3.0) is None and timers.pop(4.0) == (4.0, a)


def test_group_timers_ignore_the_entry_of_a_closed_group_whose_key_reopened():
    groups = {}
    timers = GroupTimers(groups.get)
    [old] = timed(groups, "a")
    timers.set(old, 1.0)
    timers.cancel(old)
    [new] = timed(groups, "a")  # closed, then reopened under the same key
    timers.set(new, 7.0)
    assert timers.next() == 7.0 and timers.pop(9.0) == (7.0, new)


def test_group_timers_equal_deadlines_fire_in_the_order_they_were_set():
    groups = {}
    timers = GroupTimers(groups.get)
    a, b = timed(groups, "a", "b")
    timers.set(a, 1.0)
    timers.set(b, 5.0)
    timers.set(a, 5.0)  # a's entry surfaces at 1 and is re-pushed behind b
    assert [timers.pop(9.0)[1].key for _ in range(2)] == ["b", "a"]


def test_group_timers_heap_stays_bounded_when_groups_come_and_go():
    groups = {}
    timers = GroupTimers(groups.get)
    for i in range(10_000):
        [g] = timed(groups, i)
        timers.set(g, 1e9 - i)  # each a new group, then closed: its entry goes stale
        timers.cancel(g)
        del groups[i]
    [keep] = timed(groups, "open")
    timers.set(keep, 5.0)
    assert len(timers._heap) <= 4 * 1 + 64 + 1  # rebuilt instead of growing with dead entries
    assert timers.next() == 5.0 and timers.pop(1e9) == (5.0, keep) and timers.next() is None


# -- parameters -------------------------------------------------------------------

@pytest.mark.parametrize("body, line, field, reason", [
    ("end: {literal: 2}\ncolour: red\n", 6, "nodes.x.colour", "unknown field"),
    ("group: grp\n", 4, "nodes.x.end", "is required"),
    ("end: 3\n", 5, "nodes.x.end", "must be a mapping"),
    ("end: {literal: 2, predicate: {field: last}}\n", 5, "nodes.x.end",
     "must set exactly one of literal, automatic, predicate (got literal, predicate)"),
    ("start: 5\nend: {literal: 2}\n", 6, "nodes.x.end.literal", "must be >= start (5) (got 2)"),
    ("start: -9223372036854775808\nend: {automatic: 1}\n", 5, "nodes.x.start", "must be between"),
    ("end: {literal: two}\n", 5, "nodes.x.end.literal", "must be a int"),
    ("end: {automatic: -1}\n", 5, "nodes.x.end.automatic", "must be seconds > 0"),
    ("end: {automatic: 5}\nidle_timeout: 9\n", 6, "nodes.x.idle_timeout", "end.automatic already closes idle groups"),
    ("end: {literal: 2}\nidle_timeout: 0\n", 6, "nodes.x.idle_timeout", "must be seconds > 0"),
    ("group: ''\nend: {literal: 2}\n", 5, "nodes.x.group", "empty field path"),
    ("end:\n  predicate: {field: k, equals: [1]}\n", 6, "nodes.x.end.predicate.equals", "must be a str or int"),
    ("end:\n  predicate: last\n", 6, "nodes.x.end.predicate", "must be a mapping"),
])
def test_bad_parameters_are_refused_with_file_line_field_and_reason(body, line, field, reason):
    with pytest.raises(FlowFileError) as info:
        sequence.build("x", node_params(body))
    err = info.value
    assert (err.file, err.line, err.field) == ("f.yaml", line, field)
    assert reason in err.reason


# -- properties -------------------------------------------------------------------

START, END, IDLE = 1, 4, 4.0
ENDS = {
    "literal": f"start: {START}\nend: {{literal: {END}}}",
    "predicate": f"start: {START}\nend:\n  predicate: {{field: last}}",
    "automatic": f"start: {START}\nend: {{automatic: {IDLE}}}",
}

event = st.tuples(
    st.sampled_from(["a", "b", 7, None]),                      # group (None: missing, bad input)
    st.sampled_from([0.0, 0.0, 1.0, 2.0, 3.9, 4.0, 6.0]),      # gap before it
    st.sampled_from([False, False, False, True]),              # last flag (predicate mode)
)


@settings(max_examples=200, deadline=None)
@given(mode=st.sampled_from(sorted(ENDS)), raw=st.lists(event, max_size=40), tick=st.booleans())
def test_property_numbers_are_consecutive_per_instance_and_never_given_twice(mode, raw, tick):
    node = make(end=ENDS[mode])
    t, log = 0.0, []
    for i, (grp, gap, last) in enumerate(raw):
        t += gap
        doc = {"last": last} if grp is None else {"grp": grp, "last": last}
        while tick and (d := node.next_deadline()) is not None and d <= t:
            assert node.on_time(d) == []
        emits = node.on_message(Msg(f"m{i}", doc), t)
        assert len(emits) == 1 and emits[0].msgs[0].id == f"m{i}"  # conservation: at once, once
        log.append((t, emits[0]))
    prev = {}  # group -> (time, number, last) of its previous message
    for t, e in log:
        if e.outlink == "failure":
            assert "grp" not in e.msgs[0].doc
            continue
        grp, n = e.info["group"], e.info["seq"]
        p = prev.get(grp)
        if p is None:
            new = True
        elif mode == "automatic":
            new = p[0] + IDLE <= t  # the node's own arithmetic: t - p could round below IDLE
        else:
            new = p[2]
        # A new instance starts at START; within one, each number is the previous plus one,
        # so no number is given twice in a group instance.
        assert n == (START if new else p[1] + 1)
        assert e.info["last"] == (n == END if mode == "literal" else mode == "predicate" and e.msgs[0].doc["last"])
        prev[grp] = (t, n, e.info["last"])
    while (d := node.next_deadline()) is not None:
        node.on_time(d)
    assert node.open_groups == (0 if mode == "automatic" else len({g for g, p in prev.items() if not p[2]}))
    assert node.next_deadline() is None
