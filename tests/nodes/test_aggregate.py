"""Aggregate node (Direct Project monitoring): completion rules, decaying timeouts, orphans, bad input, parameters.

Unit tests pass explicit times (a fake clock); the property tests drive the
node the way the replay engine does and check it against a whole-collection
reference written like Direct's conditions (re-evaluate every message each time).
"""

import doctest
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.fields import FieldPath
from twinflow.runtime.nodes import aggregate
from twinflow.runtime.nodes.aggregate import Aggregate, build
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.params import Doc, FlowFileError, Params

OPTION = "X-DIRECT-FINAL-DESTINATION-DELIVERY"
PROCESSED = "automatic-action/MDN-sent-automatically;processed"
DISPATCHED = "automatic-action/MDN-sent-automatically;dispatched"

_n = itertools.count()


def original(key, recipients, options=None, **extra):
    doc = {"id": key, "type": "IMF", "recipients": recipients, **extra}
    if options is not None:
        doc["disposition_options"] = options
    return Msg(key, doc)


def mdn(parent, recipient, disposition=PROCESSED, options=None, **extra):
    doc = {"id": f"mdn-{next(_n)}", "type": "MDN", "parent_id": parent, "final_recipient": recipient,
           "disposition": disposition, **extra}
    if options is not None:
        doc["disposition_options"] = options
    return Msg(doc["id"], doc)


def dsn(parent, recipient, action="failed"):
    doc = {"id": f"dsn-{next(_n)}", "type": "DSN", "parent_id": parent, "final_recipient": recipient, "action": action}
    return Msg(doc["id"], doc)


def outs(emits):
    return [(e.outlink, [m.id for m in e.msgs]) for e in emits]


def timely(timeout=600.0, **kw):
    return Aggregate("agg", completion="timely_and_reliable", timeout=timeout, **kw)


def test_module_examples_run():
    result = doctest.testmod(aggregate)
    assert result.attempted > 0 and result.failed == 0


# -- timely and reliable ------------------------------------------------------
def test_timely_needs_processed_and_dispatched_with_the_option():
    node = timely()
    assert node.on_message(original("o", "a@x"), 0.0) == []
    assert node.on_message(mdn("o", "a@x", PROCESSED), 1.0) == []
    assert node.on_message(mdn("o", "a@x", DISPATCHED), 2.0) == []  # no option: does not count
    last = mdn("o", "a@x", DISPATCHED, options=OPTION.lower() + "=optional,true")
    (e,) = node.on_message(last, 3.0)
    assert e.outlink == "complete" and len(e.msgs) == 4 and e.msgs[-1] is last
    assert e.info == {"group": "o", "rule": "timely_and_reliable"}
    assert node.pending() == 0 and node.next_deadline() is None


def test_timely_dispatched_alone_is_not_enough():
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    assert node.on_message(mdn("o", "a@x", DISPATCHED, options=[OPTION]), 1.0) == []
    assert node.pending() == 2


@pytest.mark.parametrize("disposition", ["manual-action/MDN-sent-manually;denied", "automatic-action/x;error",
                                         "DENIED"])
def test_timely_mdn_denied_or_error_completes(disposition):
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    assert outs(node.on_message(mdn("o", "a@x", disposition), 1.0))[0][0] == "complete"


@pytest.mark.parametrize("action,completes", [("failed", True), ("FAILED", True), ("delayed", False),
                                              ("delivered", False), ("relayed", False)])
def test_timely_only_a_failed_dsn_completes(action, completes):
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    assert bool(node.on_message(dsn("o", "a@x", action), 1.0)) is completes


def test_a_dsn_may_name_several_recipients():
    node = timely()
    node.on_message(original("o", ["a@x", "b@y", "c@z"]), 0.0)
    assert node.on_message(dsn("o", "rfc822;a@x, rfc822;b@y"), 1.0) == []
    assert outs(node.on_message(dsn("o", ["rfc822;c@z"]), 2.0))[0][0] == "complete"


def test_processed_wins_over_other_words_in_one_disposition():
    # Direct checks processed, then dispatched, then denied/error: the first found counts.
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    assert node.on_message(mdn("o", "a@x", "automatic-action/x;processed/error"), 1.0) == []


def test_one_incomplete_recipient_keeps_the_group():
    node = timely()
    node.on_message(original("o", "a@x, b@y"), 0.0)
    assert node.on_message(dsn("o", "a@x"), 1.0) == []
    assert outs(node.on_message(mdn("o", "b@y", "denied"), 2.0))[0][0] == "complete"


# -- general -------------------------------------------------------------------
def test_general_any_notification_per_recipient_completes():
    node = Aggregate("agg", completion="general", timeout=60.0)
    node.on_message(original("o", "a@x, b@y"), 0.0)
    assert node.on_message(dsn("o", "a@x", "delayed"), 1.0) == []
    (e,) = node.on_message(mdn("o", "b@y", DISPATCHED), 2.0)
    assert (e.outlink, e.info["rule"]) == ("complete", "general")


def test_general_reads_no_disposition_or_action():
    node = Aggregate("agg", completion="general", timeout=60.0)
    node.on_message(original("o", "a@x"), 0.0)
    bare = Msg("n", {"type": "MDN", "parent_id": "o", "final_recipient": "a@x"})
    assert outs(node.on_message(bare, 1.0)) == [("complete", ["o", "n"])]


# -- recipients ------------------------------------------------------------------
def test_recipients_are_trimmed_and_lose_their_address_type():
    node = timely()
    node.on_message(original("o", " a@x ,b@y,, "), 0.0)
    node.on_message(dsn("o", "  RFC822;  a@x  "), 1.0)
    assert node.on_message(dsn("o", "rfc822;b@y"), 2.0)[0].outlink == "complete"


def test_addresses_are_compared_as_written():
    # Direct compares addresses exactly after trimming; only option text is case-insensitive.
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    assert node.on_message(dsn("o", "A@X"), 1.0) == []
    assert node.on_time(600.0)[0].info["incomplete"] == ["a@x"]


def test_repeated_recipients_count_once_in_the_original_order():
    node = timely()
    node.on_message(original("o", ["c@z", "a@x", "c@z", "b@y"]), 0.0)
    assert node.on_time(600.0)[0].info["incomplete"] == ["c@z", "a@x", "b@y"]


def test_a_notification_for_someone_else_is_kept_but_changes_nothing():
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    stranger = dsn("o", "stranger@q")
    assert node.on_message(stranger, 1.0) == []
    (e,) = node.on_time(600.0)
    assert outs([e]) == [("timeout", ["o", stranger.id])] and e.info["incomplete"] == ["a@x"]


# -- notifications before their original -------------------------------------------
def test_notifications_before_the_original_complete_it_on_arrival():
    node = timely()
    early = [mdn("o", "a@x", PROCESSED), mdn("o", "a@x", DISPATCHED, options=OPTION)]
    for i, m in enumerate(early):
        assert node.on_message(m, float(i)) == []
    (e,) = node.on_message(original("o", "a@x"), 5.0)
    assert [m.id for m in e.msgs] == [early[0].id, early[1].id, "o"]


def test_an_orphan_group_leaves_through_orphan_at_its_timeout():
    node = timely(timeout=10.0)
    a, b = mdn("lost", "a@x"), dsn("lost", "b@y")
    node.on_message(a, 1.0)
    node.on_message(b, 4.0)
    assert node.next_deadline() == 11.0
    (e,) = node.on_time(11.0)
    assert (e.outlink, [m.id for m in e.msgs], e.info["group"]) == ("orphan", [a.id, b.id], "lost")
    assert "reason" in e.info


def test_a_late_notification_after_completion_starts_an_orphan():
    node = Aggregate("agg", completion="general", timeout=10.0)
    node.on_message(original("o", "a@x"), 0.0)
    node.on_message(mdn("o", "a@x"), 1.0)
    late = mdn("o", "a@x")
    assert node.on_message(late, 2.0) == []
    assert outs(node.on_time(12.0)) == [("orphan", [late.id])]


# -- variable completion -------------------------------------------------------------
def test_variable_completion_follows_the_originals_option():
    node = Aggregate("agg", completion="variable", timeout=60.0)
    node.on_message(original("t", "a@x", options=f"{OPTION.lower()}=optional,true"), 0.0)
    node.on_message(original("g", "a@x"), 0.0)
    assert node.on_message(mdn("t", "a@x", PROCESSED), 1.0) == []
    assert node.on_message(mdn("g", "a@x", PROCESSED), 1.0)[0].info["rule"] == "general"
    assert node.on_message(mdn("t", "a@x", DISPATCHED, options=OPTION), 2.0)[0].info["rule"] == "timely_and_reliable"


def test_variable_completion_by_a_boolean_flag_field():
    fields = aggregate.Fields(timely=FieldPath("qos.reliable"))
    node = Aggregate("agg", completion="variable", timeout=60.0, fields=fields)
    node.on_message(original("t", "a@x", qos={"reliable": True}), 0.0)
    node.on_message(original("g", "a@x", qos={"reliable": False}), 0.0)
    assert node.on_message(dsn("t", "a@x", "delayed"), 1.0) == []
    assert node.on_message(dsn("g", "a@x", "delayed"), 1.0)[0].outlink == "complete"


# -- decaying and variable timeouts ---------------------------------------------------
def test_the_timeout_counts_from_the_first_message_not_the_last():
    node = timely(timeout=10.0)
    node.on_message(original("o", "a@x, b@y"), 2.0)
    node.on_message(dsn("o", "a@x"), 9.0)
    assert node.next_deadline() == 12.0
    assert node.on_time(11.999) == []
    (e,) = node.on_time(12.0)
    assert (e.outlink, e.info["incomplete"], e.info["group"]) == ("timeout", ["b@y"], "o")
    assert node.pending() == 0 and node.next_deadline() is None


def test_a_group_started_by_a_notification_times_out_from_that_notification():
    node = timely(timeout=10.0)
    node.on_message(mdn("o", "a@x"), 1.0)
    node.on_message(original("o", "a@x"), 5.0)
    assert node.next_deadline() == 11.0


def test_variable_timeout_is_general_until_a_timely_original_arrives():
    node = Aggregate("agg", completion="variable", timeout={"timely_and_reliable": 10.0, "general": 100.0})
    node.on_message(mdn("o", "a@x"), 0.0)
    assert node.next_deadline() == 100.0
    node.on_message(original("o", "a@x", options=OPTION), 4.0)
    assert node.next_deadline() == 10.0


def test_the_decayed_timeout_is_floored_at_one_millisecond():
    # A timely original arriving after its shorter timeout has already run out
    # (counted from the first notification) gets 1 ms, as in Direct.
    node = Aggregate("agg", completion="variable", timeout={"timely_and_reliable": 10.0, "general": 100.0})
    node.on_message(mdn("o", "a@x"), 0.0)
    node.on_message(original("o", "a@x", options=OPTION), 50.0)
    assert node.next_deadline() == pytest.approx(50.001)
    assert node.on_time(50.0009) == []
    assert node.on_time(50.001)[0].outlink == "timeout"


def test_timeouts_fire_in_time_order_and_equal_deadlines_in_arrival_order():
    node = timely(timeout=10.0)
    node.on_message(original("b", "a@x"), 1.0)
    node.on_message(original("a", "a@x"), 0.0)
    node.on_message(original("c", "a@x"), 1.0)
    assert [e.info["group"] for e in node.on_time(20.0)] == ["a", "b", "c"]


def test_completed_groups_do_not_fire_and_the_heap_stays_small():
    node = timely(timeout=10.0)
    node.on_message(original("keep", "a@x"), 0.0)
    for i in range(5000):
        node.on_message(original(f"o{i}", "a@x"), 1.0)
        node.on_message(dsn(f"o{i}", "a@x"), 1.0)
    assert node.groups() == 1 and len(node._timers._heap) <= 4 * 2 + 64 + 1  # closed groups do not pile up
    assert node.next_deadline() == 10.0
    assert [e.info["group"] for e in node.on_time(100.0)] == ["keep"]


# -- bad input ---------------------------------------------------------------------
BAD = [
    (Msg("x", {"parent_id": "o", "final_recipient": "a@x"}), "message has no field 'type'"),
    (Msg("x", {"type": "RFC", "parent_id": "o"}), "field 'type' must be IMF, MDN or DSN"),
    (Msg("x", {"type": 7}), "field 'type' must be IMF, MDN or DSN"),
    (Msg("x", {"type": ["MDN"]}), "field 'type' must be IMF, MDN or DSN"),
    (Msg("x", {"type": "MDN", "final_recipient": "a@x", "disposition": "denied"}), "message has no field 'parent_id'"),
    (Msg("x", {"type": "MDN", "parent_id": True, "final_recipient": "a@x"}), "field 'parent_id' must be"),
    (Msg("x", {"type": "MDN", "parent_id": "o", "disposition": "denied"}), "message has no field 'final_recipient'"),
    (Msg("x", {"type": "MDN", "parent_id": "o", "final_recipient": " ;, ", "disposition": "denied"}),
     "names no recipient"),
    (Msg("x", {"type": "MDN", "parent_id": "o", "final_recipient": "a@x"}), "message has no field 'disposition'"),
    (Msg("x", {"type": "MDN", "parent_id": "o", "final_recipient": "a@x", "disposition": 3}),
     "field 'disposition' must be"),
    (Msg("x", {"type": "MDN", "parent_id": "o", "final_recipient": "a@x", "disposition": "dispatched",
               "disposition_options": {"a": 1}}), "field 'disposition_options' must be"),
    (Msg("x", {"type": "DSN", "parent_id": "o", "final_recipient": "a@x"}), "message has no field 'action'"),
    (Msg("x", {"type": "DSN", "parent_id": "o", "final_recipient": [1], "action": "failed"}),
     "field 'final_recipient' must be"),
    (Msg("x", {"type": "IMF", "id": "p"}), "message has no field 'recipients'"),
    (Msg("x", {"type": "IMF", "id": "p", "recipients": ""}), "names no recipient"),
    (Msg("x", {"type": "IMF", "id": "p", "recipients": {"to": "a@x"}}), "field 'recipients' must be"),
    (Msg("x", {"type": "IMF", "recipients": "a@x"}), "message has no field 'id'"),
]


@pytest.mark.parametrize("msg,reason", BAD, ids=[r for _, r in BAD])
def test_bad_input_leaves_through_failure_and_changes_nothing(msg, reason):
    node = timely(timeout=10.0)
    node.on_message(original("o", "a@x"), 0.0)
    (e,) = node.on_message(msg, 1.0)
    assert e.outlink == "failure" and e.msgs == (msg,) and reason in e.info["reason"]
    assert node.pending() == 1 and node.groups() == 1 and node.next_deadline() == 10.0


def test_a_second_original_for_a_group_is_a_failure():
    node = timely()
    node.on_message(original("o", "a@x"), 0.0)
    (e,) = node.on_message(original("o", "b@y"), 1.0)
    assert e.outlink == "failure" and "already has its original" in e.info["reason"]
    assert node.on_time(600.0)[0].info["incomplete"] == ["a@x"]


def test_a_bad_timely_flag_is_a_failure_only_when_the_flag_is_read():
    bad = original("o", "a@x", options=5)
    assert timely().on_message(bad, 0.0) == []
    (e,) = Aggregate("agg", completion="variable", timeout=1.0).on_message(bad, 0.0)
    assert e.outlink == "failure" and "disposition_options" in e.info["reason"]


def test_a_timely_flag_of_the_wrong_type_names_what_it_may_be():
    null_flag = Msg("o", {"id": "o", "type": "IMF", "recipients": "a@x", "disposition_options": None})
    (e,) = Aggregate("agg", completion="variable", timeout=1.0).on_message(null_flag, 0.0)
    assert "true, false, a text or a list of texts" in e.info["reason"]


def test_integer_correlation_values_match_their_text():
    node = Aggregate("agg", completion="general", timeout=1.0)
    node.on_message(Msg("o", {"id": 42, "type": "imf", "recipients": "a@x"}), 0.0)
    (e,) = node.on_message(Msg("n", {"type": "Dsn", "parent_id": "42", "final_recipient": "a@x"}), 0.0)
    assert e.info["group"] == "42"


# -- parameters ---------------------------------------------------------------------
def params(text):
    doc = Doc(text, "f.yaml")
    return Params(doc, "nodes.agg", doc.value["nodes"]["agg"])


def test_build_reads_every_parameter():
    node = build("agg", params(
        "nodes:\n"
        "  agg:\n"
        "    completion: variable\n"
        "    timeout: {timely_and_reliable: 60, general: 3600}\n"
        "    fields: {type: kind, message_id: msg.id, parent_id: /msg/parent, timely: qos.reliable,\n"
        "             recipients: to, final_recipient: rcpt, disposition: disp, options: opts, action: act}\n"))
    node.on_message(Msg("o", {"kind": "IMF", "msg": {"id": "o"}, "to": "a@x", "qos": {"reliable": True}}), 0.0)
    assert node.next_deadline() == 60.0
    node.on_message(Msg("n1", {"kind": "MDN", "msg": {"parent": "o"}, "rcpt": "a@x", "disp": "processed"}), 1.0)
    (e,) = node.on_message(Msg("n2", {"kind": "MDN", "msg": {"parent": "o"}, "rcpt": "a@x", "disp": "dispatched",
                                      "opts": OPTION}), 2.0)
    assert e.outlink == "complete"
    (e,) = node.on_message(Msg("n3", {"kind": "MDN", "msg": {}, "rcpt": "a@x", "disp": "denied"}), 3.0)
    assert e.info["reason"] == "message has no field '/msg/parent'"


def test_build_defaults():
    node = build("agg", params("nodes:\n  agg:\n    timeout: 30\n"))
    assert node.completion == "variable" and node.kind == "aggregate"
    assert node.outlinks == ("complete", "timeout", "orphan", "failure")


@pytest.mark.parametrize("body,line,field,reason", [
    ("    timeout: 30\n    bake: 1\n", 4, "nodes.agg.bake", "unknown field"),
    ("    completion: strict\n    timeout: 30\n", 3, "nodes.agg.completion", "must be one of"),
    ("    completion: general\n", 3, "nodes.agg.timeout", "is required"),
    ("    timeout: 0\n", 3, "nodes.agg.timeout", "must be seconds > 0"),
    ("    timeout: soon\n", 3, "nodes.agg.timeout", "(got 'soon')"),
    ("    timeout: {general: 5}\n", 3, "nodes.agg.timeout.timely_and_reliable", "is required"),
    ("    timeout: {general: 5, timely_and_reliable: 5, other: 1}\n", 3, "nodes.agg.timeout.other", "unknown field"),
    ("    timeout: {general: -1, timely_and_reliable: 5}\n", 3, "nodes.agg.timeout.general", "must be seconds > 0"),
    ("    timeout: 5\n    fields: {typo: x}\n", 4, "nodes.agg.fields.typo", "unknown field"),
    ("    timeout: 5\n    fields: {parent_id: ''}\n", 4, "nodes.agg.fields.parent_id", "empty field path"),
    ("    timeout: 5\n    fields: {recipients: 3}\n", 4, "nodes.agg.fields.recipients", "must be a str"),
    ("    completion: general\n    timeout: 5\n    fields:\n      timely: flag\n", 6, "nodes.agg.fields.timely",
     "never read"),
    ("    completion: general\n    timeout: 5\n    fields:\n      action: a\n", 6, "nodes.agg.fields.action",
     "never read"),
    ("    timeout: 5\n    fields: [type]\n", 4, "nodes.agg.fields", "must be a mapping"),
])
def test_build_refuses_bad_parameters(body, line, field, reason):
    with pytest.raises(FlowFileError) as exc:
        build("agg", params("nodes:\n  agg:\n" + body))
    err = exc.value
    assert (err.file, err.line, err.field) == ("f.yaml", line, field) and reason in err.reason


def test_timely_flag_field_is_accepted_with_a_variable_timeout():
    node = build("agg", params("nodes:\n  agg:\n    completion: general\n"
                               "    timeout: {timely_and_reliable: 1, general: 9}\n    fields: {timely: flag}\n"))
    node.on_message(original("o", "a@x", flag=True), 0.0)
    assert node.next_deadline() == 1.0


# -- properties ----------------------------------------------------------------------
TIMEOUTS = {"timely_and_reliable": 6.0, "general": 15.0}


def norm(text):
    text = text.strip()
    return text.split(";", 1)[1].strip() if ";" in text else text


def names(value):
    parts = value.split(",") if isinstance(value, str) else value
    return [a for a in map(norm, parts) if a]


def is_original(m):
    return m.doc["type"] == "IMF"


def requested(m):
    return OPTION.lower() in str(m.doc.get("disposition_options", "")).lower()


def reference_rule(msgs, completion):
    """The rule Direct's VariableCompletionCondition would pick for this collection."""
    first = next((m for m in msgs if is_original(m)), None)
    if completion != "variable":
        return completion
    return "timely_and_reliable" if first is not None and requested(first) else "general"


def reference_incomplete(msgs, rule):
    """Direct's getIncompleteRecipients, re-evaluated over the whole collection."""
    first = next(m for m in msgs if is_original(m))
    status = {r: set() for r in dict.fromkeys(names(first.doc["recipients"]))}
    for m in msgs:
        if is_original(m):
            continue
        for r in names(m.doc["final_recipient"]):
            if r not in status:
                continue
            status[r].add("any")
            if m.doc["type"] == "DSN":
                if "failed" in m.doc["action"].lower():
                    status[r].add("failed")
                continue
            d = m.doc["disposition"].lower()
            if "processed" in d:
                status[r].add("processed")
            elif "dispatched" in d:
                if OPTION.lower() in str(m.doc.get("disposition_options", "")).lower():
                    status[r].add("dispatched")
            elif "denied" in d or "error" in d:
                status[r].add("failed")

    def done(s):
        if rule == "general":
            return "any" in s
        return {"processed", "dispatched"} <= s or "failed" in s
    return [r for r, s in status.items() if not done(s)]


def spellings(people, most):
    """1 to ``most`` addresses as a sender might write them (spaces, rfc822;
    prefixes, repeats), as a comma-separated text or a list. Built once, so
    that drawing an address field costs Hypothesis one choice."""
    by_count = []
    for k in range(1, most + 1):
        forms = []
        for combo in itertools.product(people, repeat=k):
            for style in ("{}", " rfc822;{} ", "RFC822; {}  "):
                written = [style.format(p) for p in combo]
                forms += [", ".join(written), written]
        by_count.append(forms)
    # Each count of addresses gets the same weight, so single addresses stay common.
    largest = max(map(len, by_count))
    return [form for forms in by_count for form in forms * (largest // len(forms))]


# The truth table of Direct's rules; repeated entries weigh the draw towards
# the combinations that complete a timely-and-reliable recipient.
NOTICES = (
    [{"type": "MDN", "disposition": d} for d in (PROCESSED, PROCESSED, PROCESSED, DISPATCHED, DISPATCHED,
                                                   "denied", "x;error", "deleted")]
    + [{"type": "MDN", "disposition": DISPATCHED, "disposition_options": o} for o in (OPTION, OPTION.lower(), [OPTION],
                                                                                       "other")]
    + [{"type": "DSN", "action": a} for a in ("failed", "Failed", "delayed", "delivered")]
    + [{"type": "MDN", "disposition": "denied", "bad": True}]  # lacks parent_id: must fail
)
REQUESTS = [None, None, OPTION, OPTION.lower() + "=optional,true", "other"]


def events(groups=("g0", "g1", "g2"), people=("a@x", "b@y", "c@z"), gaps=(0.0, 0.0, 0.5, 2.0, 5.0, 9.0), most=25):
    recipients, named = spellings(list(people), 3), spellings(list(people) + ["z@q"], 2)
    step = st.tuples(st.sampled_from(gaps), st.sampled_from(groups), st.integers(0, 3), st.sampled_from(NOTICES),
                     st.sampled_from(recipients), st.sampled_from(named), st.sampled_from(REQUESTS))

    def messages(steps):
        out = []
        for n, (dt, group, pick, notice, to, final, request) in enumerate(steps):
            if pick == 0:
                doc = {"id": group, "type": "IMF", "recipients": to}
                if request is not None:
                    doc["disposition_options"] = request
            else:
                doc = {"id": f"m{n}", **notice, "parent_id": group, "final_recipient": final}
                if doc.pop("bad", False):
                    del doc["parent_id"]
            out.append((dt, Msg(f"m{n}", doc)))
        return out
    return st.lists(step, min_size=1, max_size=most).map(messages)


class Harness:
    """Drives the node as the replay engine does (deadlines first, each at its own
    time) and checks every emission against the reference."""

    def __init__(self, completion, timeout):
        self.completion, self.timeout = completion, timeout
        self.node = Aggregate("agg", completion=completion, timeout=timeout)
        self.open: dict[str, dict] = {}  # key -> {"msgs", "start", "last", "deadline"}
        self.emitted: list[str] = []
        self.fed = 0

    def run(self, steps):
        now = 0.0
        for dt, msg in steps:
            now += dt
            self.fire_until(now)
            key, bad = self.accept(msg, now)
            emits = self.node.on_message(msg, now)
            self.fed += 1
            if bad:
                assert outs(emits) == [("failure", [msg.id])]
                self.emitted.append(msg.id)
            elif emits:
                assert [e.outlink for e in emits] == ["complete"]
                self.check(now, emits[0])
            else:
                self.still_open(key, now)
            assert self.node.pending() == self.fed - len(self.emitted)
        self.fire_until(math.inf)

    def fire_until(self, until):
        while (d := self.node.next_deadline()) is not None and d <= until:
            for e in self.node.on_time(d):
                self.check(d, e)

    def accept(self, msg, now):
        """The message's group key, and whether it must fail; a good one joins its group."""
        if not is_original(msg) and "parent_id" not in msg.doc:
            return None, True
        key = msg.doc["id"] if is_original(msg) else msg.doc["parent_id"]
        g = self.open.get(key)
        if is_original(msg) and g is not None and any(is_original(m) for m in g["msgs"]):
            return key, True
        g = self.open.setdefault(key, {"msgs": [], "start": now})
        g["msgs"].append(msg)
        g["last"] = now
        return key, False

    def still_open(self, key, now):
        g = self.open[key]
        first = next((m for m in g["msgs"] if is_original(m)), None)
        if first is not None:  # not complete: the reference must agree
            assert reference_incomplete(g["msgs"], reference_rule(g["msgs"], self.completion)) != []
        if isinstance(self.timeout, dict):
            t = self.timeout["timely_and_reliable" if first is not None and requested(first) else "general"]
        else:
            t = self.timeout
        g["deadline"] = max(g["start"] + t, now + 0.001)

    def check(self, at, e):
        self.emitted.extend(m.id for m in e.msgs)
        g = self.open.pop(e.info["group"])
        assert list(e.msgs) == g["msgs"]
        has_original = any(is_original(m) for m in g["msgs"])
        rule = reference_rule(g["msgs"], self.completion)
        if e.outlink == "complete":
            assert at == g["last"] and reference_incomplete(g["msgs"], rule) == []
            return
        assert at == g["deadline"]  # the decaying deadline, never pushed back by later messages
        assert e.outlink == ("timeout" if has_original else "orphan")
        if has_original:
            assert e.info["rule"] == rule
            assert e.info["incomplete"] == reference_incomplete(g["msgs"], rule) != []


@settings(max_examples=200, deadline=None)
@given(steps=events(), completion=st.sampled_from(["timely_and_reliable", "general", "variable"]),
       variable_timeout=st.booleans())
def test_property_aggregation_matches_direct(steps, completion, variable_timeout):
    """Conservation; a group completes iff its rule says so; a timeout carries
    exactly the incomplete recipients and fires at the decaying deadline."""
    h = Harness(completion, TIMEOUTS if variable_timeout else 8.0)
    h.run(steps)
    assert sorted(h.emitted) == sorted(m.id for _, m in steps)  # every message left exactly once
    assert len(h.emitted) == len(set(h.emitted))
    assert h.node.pending() == 0 and h.node.groups() == 0 and h.open == {}


@settings(max_examples=200, deadline=None)
@given(steps=events(groups=("g",), people=("a@x",), gaps=(0.0,), most=10),
       completion=st.sampled_from(["timely_and_reliable", "general", "variable"]))
def test_property_completion_truth_table(steps, completion):
    """One group and one recipient, no time passing: completes exactly when Direct's rule says so."""
    h = Harness(completion, 8.0)
    h.run(steps)
    assert h.node.pending() == 0 and sorted(h.emitted) == sorted(m.id for _, m in steps)
