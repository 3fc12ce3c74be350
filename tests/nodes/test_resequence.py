"""Resequence node (IBM ACE): order per group, ends of sequence, missing messages, bad input.

Time is a plain float passed in; ``drive`` plays the engine: before each
message it fires every deadline at or before the message's time, each at its
own deadline, and at the end fires deadlines until none is left.
"""

import doctest
import math
import textwrap
from functools import lru_cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.nodes import resequence
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.sequence import SEQ_MAX
from twinflow.runtime.flowgraph import node_params as section_params
from twinflow.runtime.params import Doc, FlowFileError, Params


@lru_cache(maxsize=None)  # parsing YAML dominates the property tests otherwise
def node_params(body: str) -> Params:
    """The parameters of node x in a flow file whose node body is ``body`` (from line 5)."""
    text = "flow: t\nnodes:\n  x:\n    type: resequence\n" + textwrap.indent(textwrap.dedent(body), "    ")
    doc = Doc(text, "f.yaml")
    return section_params(Params(doc, "", doc.value).section("nodes").section("x"))


def make(end="end: {literal: 6}", extra="", timeout=5):
    body = f"sequence_number: seq\ngroup: grp\n{end}\nmissing_message_timeout: {timeout}\n{extra}"
    return resequence.build("x", node_params(body))


def m(grp, seq, mid=None, **fields):
    return Msg(mid or f"{grp}{seq}", {"grp": grp, "seq": seq, **fields})


def sent(emits):
    return [(e.outlink, e.msgs[0].id) for e in emits]


def drive(node, events, tick=True):
    """Feed ``(time, msg)`` pairs; return ``(time, emit)`` for everything that left."""
    log = []

    def fire(limit):
        while (d := node.next_deadline()) is not None and d <= limit:
            log.extend((d, e) for e in node.on_time(d))

    for t, msg in events:
        if tick:
            fire(t)
        log.extend((t, e) for e in node.on_message(msg, t))
    fire(math.inf)
    return log


def test_docstring_example():
    result = doctest.testmod(resequence)
    assert result.attempted > 0 and result.failed == 0


# -- ACE's rules -------------------------------------------------------------

def test_seed_example_six_down_to_zero_leaves_zero_to_six():
    node = make(timeout=30)
    for t, n in enumerate(range(6, 0, -1)):
        assert node.on_message(m("a", n), float(t)) == []
    assert node.pending() == 6
    emits = node.on_message(m("a", 0), 6.0)
    assert sent(emits) == [("out", f"a{n}") for n in range(7)]
    assert [e.info for e in emits] == [{"group": "a", "seq": n} for n in range(7)]
    assert node.pending() == 0 and node.open_groups == 0 and node.next_deadline() is None


def test_next_message_leaves_at_once_and_groups_are_independent():
    node = make()
    assert sent(node.on_message(m("a", 0), 0.0)) == [("out", "a0")]
    assert node.on_message(m("b", 1), 0.0) == []
    assert sent(node.on_message(m("a", 1), 0.0)) == [("out", "a1")]
    assert sent(node.on_message(m("b", 0), 0.0)) == [("out", "b0"), ("out", "b1")]


def test_closed_group_starts_a_new_instance():
    node = make(end="end: {literal: 1}")
    node.on_message(m("a", 0), 0.0)
    assert sent(node.on_message(m("a", 1), 0.0)) == [("out", "a1")]
    assert node.open_groups == 0
    # A new instance expects start (0) again: 1 waits.
    assert node.on_message(m("a", 1, "a1-next"), 1.0) == []
    assert sent(node.on_message(m("a", 0, "a0-next"), 1.0)) == [("out", "a0-next"), ("out", "a1-next")]


def test_start_is_a_literal_and_may_be_negative():
    node = make(end="start: -2\nend: {literal: 0}")
    assert node.on_message(m("a", -1), 0.0) == []
    assert sent(node.on_message(m("a", -2), 0.0)) == [("out", "a-2"), ("out", "a-1")]


def test_without_a_group_path_all_messages_form_one_group():
    p = node_params("sequence_number: seq\nend: {literal: 1}\nmissing_message_timeout: 5\n")
    node = resequence.build("x", p)
    node.on_message(Msg("p", {"seq": 1}), 0.0)
    emits = node.on_message(Msg("q", {"seq": 0, "grp": "ignored"}), 0.0)
    assert sent(emits) == [("out", "q"), ("out", "p")]
    assert emits[0].info == {"seq": 0}


# -- missing-message time-out ---------------------------------------------------

def test_missing_message_timeout_gives_up_and_the_rest_of_the_instance_expires():
    node = make(end="end: {literal: 4}", timeout=5)
    node.on_message(m("a", 0), 0.0)
    node.on_message(m("a", 2), 1.0)  # blocked on 1 from now
    node.on_message(m("a", 3), 2.0)  # still blocked: the timer does not move
    assert node.next_deadline() == 6.0
    assert node.on_time(5.99) == []
    emits = node.on_time(6.0)
    assert sent(emits) == [("expired", "a2"), ("expired", "a3")]
    assert emits[0].info == {"group": "a", "seq": 2}
    assert node.pending() == 0 and node.next_deadline() is None
    # The late number leaves through missing; a second copy of it is a duplicate.
    assert sent(node.on_message(m("a", 1), 7.0)) == [("missing", "a1")]
    assert sent(node.on_message(m("a", 1, "a1-again"), 7.0)) == [("failure", "a1-again")]
    # The instance has expired: its last message leaves through expired too, and closes it.
    assert sent(node.on_message(m("a", 4), 8.0)) == [("expired", "a4")]
    assert node.open_groups == 0
    assert sent(node.on_message(m("a", 0, "a0-next"), 9.0)) == [("out", "a0-next")]


def test_missing_timer_restarts_when_a_message_leaves():
    node = make(timeout=5)
    node.on_message(m("a", 2), 0.0)  # blocked on 0
    assert node.next_deadline() == 5.0
    node.on_message(m("a", 0), 3.0)  # 0 leaves; now blocked on 1
    assert node.next_deadline() == 8.0


def test_each_gap_costs_one_timeout():
    node = make(timeout=5)
    node.on_message(m("a", 2), 0.0)
    node.on_message(m("a", 4), 0.0)
    log = drive(node, [])
    assert [(t, e.outlink, e.msgs[0].id) for t, e in log] == [(5.0, "expired", "a2"), (10.0, "expired", "a4")]


def test_equal_deadlines_fire_in_the_order_they_were_set():
    node = make(timeout=5)
    node.on_message(m("b", 1), 0.0)
    node.on_message(m("a", 1), 0.0)
    assert sent(node.on_time(5.0)) == [("expired", "b1"), ("expired", "a1")]


def test_overdue_deadlines_fire_before_a_message_even_without_a_tick():
    node = make(timeout=5)
    node.on_message(m("a", 1), 0.0)
    # At exactly the deadline the time-out comes first, so 0 is late (missing).
    assert sent(node.on_message(m("a", 0), 5.0)) == [("expired", "a1"), ("missing", "a0")]


# -- end of sequence: predicate and automatic -----------------------------------

PREDICATE = "end:\n  predicate: {field: last, equals: true}"


def test_predicate_last_message_closes_the_group_once_everything_before_it_left():
    node = make(end=PREDICATE)
    assert node.on_message(m("a", 2, last=True), 0.0) == []
    assert sent(node.on_message(m("a", 0), 0.0)) == [("out", "a0")]
    assert node.open_groups == 1
    assert sent(node.on_message(m("a", 1), 0.0)) == [("out", "a1"), ("out", "a2")]
    assert node.open_groups == 0


def test_predicate_last_message_that_is_not_the_highest_goes_to_failure():
    node = make(end=PREDICATE)
    node.on_message(m("a", 4), 0.0)
    emits = node.on_message(m("a", 3, last=True), 0.0)
    assert sent(emits) == [("failure", "a3")]
    assert emits[0].info["reason"] == ("the end-of-sequence predicate marks 3 last, "
                                       "but 4 was already collected in this group instance")
    # It changed nothing: 3 is still expected, and a later last message is accepted.
    node.on_message(m("a", 5, last=True), 0.0)
    assert [e.info["seq"] for e in node.on_message(m("a", 0), 0.0)] == [0]
    assert sent(node.on_message(m("a", 6), 0.0)) == [("failure", "a6")]  # beyond the end (5)


def test_predicate_truth_table_form():
    node = make(end="end:\n  predicate: {field: flags.last}")
    node.on_message(Msg("x0", {"grp": "a", "seq": 0, "flags": {"last": "TRUE"}}), 0.0)
    assert node.open_groups == 0
    node.on_message(Msg("y0", {"grp": "a", "seq": 0, "flags": {"last": 0}}), 0.0)
    node.on_message(Msg("y1", {"grp": "a", "seq": 1}), 0.0)  # no field: not last
    assert node.open_groups == 1


def test_automatic_end_closes_a_group_whose_queue_stayed_empty():
    node = make(end="end: {automatic: 10}", timeout=5)
    node.on_message(m("a", 0), 0.0)
    assert node.next_deadline() == 10.0
    node.on_message(m("a", 2), 4.0)  # queue not empty: the missing timer replaces the idle one
    assert node.next_deadline() == 9.0
    node.on_message(m("a", 1), 6.0)  # queue empty again: idle from 6
    assert node.next_deadline() == 16.0
    assert node.on_time(16.0) == []
    assert node.open_groups == 0 and node.next_deadline() is None
    assert node.on_message(m("a", 3), 17.0) == []  # a new instance waits for 0


def test_automatic_end_timer_resets_on_each_message():
    node = make(end="end: {automatic: 10}")
    node.on_message(m("a", 0), 0.0)
    node.on_message(m("a", 1), 9.0)
    assert node.on_time(10.0) == [] and node.open_groups == 1
    assert node.next_deadline() == 19.0


def test_idle_timeout_closes_an_open_literal_group():
    node = make(extra="idle_timeout: 60")
    node.on_message(m("a", 0), 0.0)
    assert node.next_deadline() == 60.0
    node.on_time(60.0)
    assert node.open_groups == 0


# -- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("doc, reason", [
    ({"grp": "a"}, "message has no field 'seq'"),
    ({"seq": 0}, "message has no field 'grp'"),
    ({"grp": "a", "seq": "0"}, "sequence number 'seq' must be an integer (got '0')"),
    ({"grp": "a", "seq": True}, "sequence number 'seq' must be an integer (got True)"),
    ({"grp": "a", "seq": 1.0}, "sequence number 'seq' must be an integer (got 1.0)"),
    ({"grp": "a", "seq": SEQ_MAX + 1}, f"sequence number {SEQ_MAX + 1} is outside -{SEQ_MAX}..{SEQ_MAX}"),
    ({"grp": ["a"], "seq": 0}, "group identifier 'grp' must be a string or an integer (got ['a'])"),
    ({"grp": "a", "seq": -1}, "sequence number -1 is below the start of sequence (0)"),
    ({"grp": "a", "seq": 7}, "sequence number 7 is beyond the end of sequence (6)"),
])
def test_bad_input_goes_to_failure_with_the_reason_and_changes_nothing(doc, reason):
    node = make()
    node.on_message(m("a", 2), 0.0)
    emits = node.on_message(Msg("bad", doc), 1.0)
    assert sent(emits) == [("failure", "bad")] and emits[0].info == {"reason": reason}
    assert node.pending() == 1 and node.next_deadline() == 5.0
    assert sent(node.on_message(m("a", 0), 2.0)) == [("out", "a0")]


def test_duplicates_go_to_failure():
    node = make()
    node.on_message(m("a", 0), 0.0)
    node.on_message(m("a", 2), 0.0)
    held = node.on_message(m("a", 2, "dup2"), 0.0)
    left = node.on_message(m("a", 0, "dup0"), 0.0)
    assert held[0].info["reason"] == "duplicate: sequence number 2 is already held in this group instance"
    assert left[0].info["reason"] == "duplicate: sequence number 0 already left this group instance"
    assert node.pending() == 1


# -- parameters -------------------------------------------------------------------

@pytest.mark.parametrize("body, line, field, reason", [
    ("sequence_number: seq\nend: {literal: 1}\nmissing_message_timeout: 5\nbogus: 1\n",
     8, "nodes.x.bogus", "unknown field"),
    ("end: {literal: 1}\nmissing_message_timeout: 5\n", 4, "nodes.x.sequence_number", "is required"),
    ("sequence_number: seq\nmissing_message_timeout: 5\n", 4, "nodes.x.end", "is required"),
    ("sequence_number: seq\nend: {literal: 1, automatic: 5}\nmissing_message_timeout: 5\n",
     6, "nodes.x.end", "must set exactly one of literal, automatic, predicate (got literal, automatic)"),
    ("sequence_number: seq\nend: {}\nmissing_message_timeout: 5\n",
     6, "nodes.x.end", "must set exactly one of literal, automatic, predicate"),
    ("sequence_number: seq\nstart: 3\nend: {literal: 2}\nmissing_message_timeout: 5\n",
     7, "nodes.x.end.literal", "must be >= start (3) (got 2)"),
    ("sequence_number: seq\nend: {literal: 9223372036854775808}\nmissing_message_timeout: 5\n",
     6, "nodes.x.end.literal", "must be between"),
    ("sequence_number: seq\nend: {automatic: 0}\nmissing_message_timeout: 5\n",
     6, "nodes.x.end.automatic", "must be seconds > 0"),
    ("sequence_number: seq\nend: {literal: 1}\n", 4, "nodes.x.missing_message_timeout", "is required"),
    ("sequence_number: seq\nend: {literal: 1}\nmissing_message_timeout: -1\n",
     7, "nodes.x.missing_message_timeout", "must be seconds > 0"),
    ("sequence_number: seq\nend: {automatic: 5}\nmissing_message_timeout: 5\nidle_timeout: 5\n",
     8, "nodes.x.idle_timeout", "end.automatic already closes idle groups"),
    ("sequence_number: 5\nend: {literal: 1}\nmissing_message_timeout: 5\n",
     5, "nodes.x.sequence_number", "must be a str"),
    ("sequence_number: seq\nstart: yes\nend: {literal: 1}\nmissing_message_timeout: 5\n",
     6, "nodes.x.start", "must be a int"),
    ("sequence_number: seq\nend:\n  predicate: {field: k, equals: 1, in: [1]}\nmissing_message_timeout: 5\n",
     7, "nodes.x.end.predicate.in", "give either equals or in, not both"),
    ("sequence_number: seq\nend:\n  predicate: {field: k, in: []}\nmissing_message_timeout: 5\n",
     7, "nodes.x.end.predicate.in", "must list at least one value"),
    ("sequence_number: seq\nend:\n  predicate: {field: k, in: [a, {b: 1}]}\nmissing_message_timeout: 5\n",
     7, "nodes.x.end.predicate.in[1]", "must be a string, number, boolean or null"),
    ("sequence_number: seq\nend:\n  predicate: {equals: 1}\nmissing_message_timeout: 5\n",
     7, "nodes.x.end.predicate.field", "is required"),
    ("sequence_number: seq\nend:\n  predicate: {field: k, is: 1}\nmissing_message_timeout: 5\n",
     7, "nodes.x.end.predicate.is", "unknown field"),
])
def test_bad_parameters_are_refused_with_file_line_field_and_reason(body, line, field, reason):
    with pytest.raises(FlowFileError) as info:
        resequence.build("x", node_params(body))
    err = info.value
    assert (err.file, err.line, err.field) == ("f.yaml", line, field)
    assert reason in err.reason


# -- properties -------------------------------------------------------------------

START, END, TIMEOUT, IDLE = 0, 5, 5.0, 4.0
ENDS = {
    "literal": f"end: {{literal: {END}}}",
    "predicate": PREDICATE,
    "automatic": f"end: {{automatic: {IDLE}}}",
}

event = st.tuples(
    st.sampled_from("ab"),                                       # group
    st.sampled_from([*range(START - 1, END + 2), "bad"]),        # number (some out of range), or bad input
    st.sampled_from([0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 3.0, 6.0]),   # gap before it (timeouts are 4 and 5)
    st.sampled_from([False, False, False, True]),                # last flag (predicate mode)
)


def events_from(raw):
    t, out = 0.0, []
    for i, (grp, seq, gap, last) in enumerate(raw):
        t += gap
        out.append((t, Msg(f"m{i}", {"grp": grp, "seq": seq, "last": last})))
    return out


def check_key_order(mode, log):
    """Per group instance, out/expired numbers increase; out runs start, start+1, ... with no gap."""
    prev = {}  # group -> (time, seq, doc, outlink) of its last out/expired emission
    for t, e in log:
        if e.outlink not in ("out", "expired"):
            continue
        grp, seq, doc = e.info["group"], e.info["seq"], e.msgs[0].doc
        assert START <= seq and doc["seq"] == seq
        p = prev.get(grp)
        if p is None:
            new = True
        elif mode == "literal":
            new = p[1] == END
        elif mode == "predicate":
            new = p[2]["last"] is True
        else:  # automatic: an instance can only close after IDLE seconds without output
            new = seq <= p[1] and p[0] + IDLE <= t
        if new:
            if e.outlink == "out":
                assert seq == START
        else:
            assert seq > p[1], f"group {grp}: {seq} after {p[1]} in one instance"
            if e.outlink == "out":
                assert p[3] == "out" and seq == p[1] + 1
        prev[grp] = (t, seq, doc, e.outlink)


@settings(max_examples=200, deadline=None)
@given(mode=st.sampled_from(sorted(ENDS)), raw=st.lists(event, max_size=40))
def test_property_order_per_group_and_conservation(mode, raw):
    node = make(end=ENDS[mode], timeout=TIMEOUT)
    events = events_from(raw)
    log = drive(node, events)
    left = [e.msgs[0].id for _, e in log]
    assert sorted(left) == sorted(msg.id for _, msg in events)  # each leaves exactly once
    assert all(len(e.msgs) == 1 for _, e in log)
    assert node.pending() == 0
    check_key_order(mode, log)
    # Ticking is optional: firing overdue deadlines inside on_message gives the same result.
    untimed = drive(make(end=ENDS[mode], timeout=TIMEOUT), events, tick=False)
    assert [(e.outlink, e.msgs[0].id, dict(e.info)) for _, e in untimed] == \
           [(e.outlink, e.msgs[0].id, dict(e.info)) for _, e in log]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), size=st.integers(1, 12), groups=st.integers(1, 3))
def test_property_any_permutation_leaves_in_order(data, size, groups):
    node = make(end=f"end: {{literal: {size - 1}}}", timeout=1e6)
    arrivals = [(g, n) for g in range(groups) for n in range(size)]
    arrivals = data.draw(st.permutations(arrivals))
    log = drive(node, [(float(i), m(str(g), n)) for i, (g, n) in enumerate(arrivals)])
    for g in range(groups):
        assert [(e.outlink, e.info["seq"]) for _, e in log if e.info["group"] == str(g)] == \
               [("out", n) for n in range(size)]
    assert node.open_groups == 0 and node.pending() == 0
