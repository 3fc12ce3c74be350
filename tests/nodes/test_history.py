"""History node (Integration Server's document history): verdicts, completion, resolver, expiry, bad input, parameters (fake clock)."""

from __future__ import annotations

import doctest
import gc
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.fields import FieldPath
from twinflow.runtime.flowgraph import load_graph, parse_graph
from twinflow.runtime.nodes import history
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.history import (
    ATTEMPT_IN_DOUBT, BOTH_ENTRIES, COMPLETED, COMPLETED_ONLY, IN_PROGRESS, MASTER_DIED, NOT_COMPLETED,
    PROCESSING, TOO_LONG, Doubt, Entry, HistoryNode, MemoryHistoryStore, build,
)
from twinflow.runtime.params import Doc, FlowFileError, Params
from twinflow.runtime.replay import replay

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def m(msg_id: str, uuid=..., **doc) -> Msg:
    if uuid is not ...:
        doc["uuid"] = uuid
    return Msg(msg_id, doc)


def route(node, msg, now):
    """The one emission a message causes, as (outlink, info)."""
    [e] = node.on_message(msg, now)
    assert e.msgs == (msg,)
    return e.outlink, dict(e.info)


def outlink(node, msg, now) -> str:
    return route(node, msg, now)[0]


# -- Integration Server's table --------------------------------------------------
def test_new_then_duplicate_with_both_entries_at_one_timestamp():
    node = HistoryNode("guard")
    assert route(node, m("m1", "u1"), 10.0) == ("new", {})
    assert node.store.get(("guard", "u1")) == Entry(10.0, True, True)
    assert route(node, m("m2", "u1"), 11.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_completed_entry_only_is_a_duplicate():
    store = MemoryHistoryStore()
    store.put(("guard", "u1"), COMPLETED, 5.0)
    node = HistoryNode("guard", store=store)
    assert route(node, m("m1", "u1"), 6.0) == ("duplicate", {"reason": COMPLETED_ONLY})


def test_processing_entry_only_is_in_doubt_without_a_resolver():
    node = HistoryNode("guard", completion="external")
    assert outlink(node, m("m1", "u1"), 0.0) == "new"
    assert node.store.get(("guard", "u1")) == Entry(0.0, True, False)
    assert route(node, m("m2", "u1"), 3.0) == ("in_doubt", {"reason": NOT_COMPLETED})


def test_uuid_over_96_characters_is_in_doubt_and_never_recorded():
    node = HistoryNode("guard")
    assert outlink(node, m("m1", "u" * 96), 0.0) == "new"
    assert route(node, m("m2", "u" * 97), 0.0) == ("in_doubt", {"reason": TOO_LONG})
    assert route(node, m("m3", "u" * 97), 1.0) == ("in_doubt", {"reason": TOO_LONG})
    assert len(node.store) == 1


# -- identity ----------------------------------------------------------------
@pytest.mark.parametrize("doc", [{}, {"uuid": None}, {"uuid": ""}], ids=["absent", "null", "empty"])
def test_message_id_stands_in_for_a_missing_uuid(doc):
    node = HistoryNode("guard")
    assert outlink(node, Msg("m1", doc), 0.0) == "new"
    assert node.store.get(("guard", "m1")) is not None
    assert outlink(node, Msg("m1", doc), 1.0) == "duplicate"
    assert outlink(node, m("other", "m1"), 2.0) == "duplicate"  # same identifier, given as uuid


def test_message_id_over_96_characters_is_in_doubt():
    node = HistoryNode("guard")
    assert route(node, Msg("i" * 97, {}), 0.0) == ("in_doubt", {"reason": TOO_LONG})


@pytest.mark.parametrize("path", ["header.uuid", "/header/uuid"])
def test_nested_uuid_field(path):
    node = HistoryNode("guard", uuid=FieldPath(path))
    assert outlink(node, Msg("m1", {"header": {"uuid": "u1"}}), 0.0) == "new"
    assert outlink(node, Msg("m2", {"header": {"uuid": "u1"}}), 1.0) == "duplicate"
    assert outlink(node, Msg("m3", {"header": "flat"}), 2.0) == "new"  # no uuid there: the ID stands in


def test_a_document_that_is_a_mapping_but_not_a_dict():
    from types import MappingProxyType

    node = HistoryNode("guard")
    assert outlink(node, Msg("m1", MappingProxyType({"uuid": "u1"})), 0.0) == "new"
    assert node.store.get(("guard", "u1")) is not None


def test_the_trigger_is_part_of_the_key():
    store = MemoryHistoryStore()
    a = HistoryNode("a", store=store)
    b = HistoryNode("b", store=store)
    a2 = HistoryNode("a2", store=store, trigger="a")
    assert outlink(a, m("m1", "u1"), 0.0) == "new"
    assert outlink(b, m("m1", "u1"), 0.0) == "new"
    assert outlink(a2, m("m1", "u1"), 0.0) == "duplicate"


# -- bad input -----------------------------------------------------------------
@pytest.mark.parametrize("value,kind", [(42, "int"), (1.5, "float"), (True, "bool"), (["u"], "list"), ({"a": 1}, "dict")])
def test_a_uuid_that_is_not_a_string_leaves_through_failure(value, kind):
    node = HistoryNode("guard")
    assert route(node, m("m1", value), 0.0) == ("failure", {"reason": f"field 'uuid' must be a string (got {kind})"})
    assert len(node.store) == 0
    assert outlink(node, m("m2", "u2"), 1.0) == "new"  # and the node keeps running


def test_no_uuid_and_no_message_id_leaves_through_failure():
    node = HistoryNode("guard")
    assert route(node, Msg("", {}), 0.0) == ("failure", {"reason": "message has no field 'uuid' and no message ID"})


# -- completion ------------------------------------------------------------------
def test_external_completion_by_message_id_keeps_the_processing_timestamp():
    node = HistoryNode("guard", completion="external")
    node.on_message(m("m1", "u1"), 10.0)
    assert node.completed("m1", 12.0) is True
    assert node.store.get(("guard", "u1")) == Entry(10.0, True, True)
    assert route(node, m("m2", "u1"), 13.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_external_completion_by_uuid():
    node = HistoryNode("guard", completion="external")
    node.on_message(m("m1", "u1"), 10.0)
    assert node.completed("u1", 11.0) is True
    assert outlink(node, m("m2", "u1"), 12.0) == "duplicate"


def test_completion_of_nothing_open_records_nothing():
    node = HistoryNode("guard", completion="external")
    assert node.completed("nobody", 0.0) is False
    node.on_message(m("m1", "u1"), 0.0)
    assert node.completed("m1", 1.0) is True
    assert node.completed("m1", 2.0) is False  # already completed
    assert len(node.store) == 1


def test_completion_after_expiry_records_nothing():
    node = HistoryNode("guard", retention=10.0, completion="external")
    node.on_message(m("m1", "u1"), 0.0)
    assert node.completed("m1", 10.0) is False
    assert len(node.store) == 0 and not node._open


def test_only_the_message_that_ran_can_complete_by_message_id():
    node = HistoryNode("guard", completion="external")
    node.on_message(m("m1", "u1"), 0.0)
    assert outlink(node, m("m2", "u1"), 0.0) == "in_doubt"
    assert node.completed("m2", 0.0) is False
    assert node.completed("m1", 0.0) is True


def test_immediate_completion_leaves_nothing_open():
    node = HistoryNode("guard")
    node.on_message(m("m1", "u1"), 0.0)
    assert node.completed("m1", 1.0) is False and not node._open


# -- expiry ------------------------------------------------------------------------
def test_both_entries_expire_together_after_the_retention():
    node = HistoryNode("guard", retention=60.0)
    node.on_message(m("m1", "u1"), 0.0)
    assert outlink(node, m("m2", "u1"), 59.999) == "duplicate"
    assert outlink(node, m("m3", "u1"), 60.0) == "new"
    assert node.store.get(("guard", "u1")) == Entry(60.0, True, True)


def test_on_time_clears_expired_entries_and_emits_nothing():
    node = HistoryNode("guard", retention=5.0)
    for i in range(3):
        node.on_message(m(f"m{i}", f"u{i}"), float(i))
    assert node.next_deadline() == 5.0  # the oldest entry's retention ends (rounded up to a second)
    assert node.on_time(6.0) == [] and len(node.store) == 1
    assert node.next_deadline() == 7.0 and node.pending() == 0  # u2, recorded at 2.0
    assert node.on_time(7.0) == [] and len(node.store) == 0 and node.next_deadline() is None


def test_an_entry_the_store_has_not_cleared_yet_is_still_expired():
    class Lazy(MemoryHistoryStore):
        def clear_expired(self, cutoff):
            return 0

    node = HistoryNode("guard", retention=5.0, store=Lazy())
    node.on_message(m("m1", "u1"), 0.0)
    assert outlink(node, m("m2", "u1"), 5.0) == "new"


def test_time_going_backwards_delays_memory_release_never_a_verdict():
    node = HistoryNode("guard", retention=10.0)
    node.on_message(m("m1", "late"), 100.0)
    node.on_message(m("m2", "early"), 50.0)
    assert outlink(node, m("m3", "early"), 60.0) == "new"  # 'early' expired at 60
    assert outlink(node, m("m4", "late"), 105.0) == "duplicate"


def test_store_skips_stale_items_of_a_key_run_again():
    store = MemoryHistoryStore()
    store.put(("t", "u"), PROCESSING, 1.0)
    store.put(("t", "u"), PROCESSING, 3.0)  # run again: replaces the entry
    assert store.get(("t", "u")) == Entry(3.0, True, False)
    assert store.clear_expired(2.0) == 0 and len(store) == 1
    assert store.clear_expired(3.0) == 1 and len(store) == 0


def test_store_refuses_an_unknown_status():
    with pytest.raises(ValueError, match="status"):
        MemoryHistoryStore().put(("t", "u"), "done", 1.0)


# -- resolver ---------------------------------------------------------------------
def answering(verdict, seen=None):
    def resolver(msg, doubt):
        if seen is not None:
            seen.append((msg.id, doubt))
        return verdict
    return resolver


def test_resolver_is_told_why_and_since_when():
    seen = []
    node = HistoryNode("guard", completion="external", resolver=answering("duplicate", seen))
    node.on_message(m("m1", "u1"), 4.0)
    assert route(node, m("m2", "u1"), 9.0) == ("duplicate", {"reason": NOT_COMPLETED, "resolver": "duplicate"})
    assert route(node, m("m3", "x" * 97), 9.5) == ("duplicate", {"reason": TOO_LONG, "resolver": "duplicate"})
    assert seen == [("m2", Doubt("guard", "u1", NOT_COMPLETED, 4.0, 9.0)),
                    ("m3", Doubt("guard", "x" * 97, TOO_LONG, None, 9.5))]


def test_resolver_new_runs_the_message_again_and_records_it():
    node = HistoryNode("guard", completion="external", resolver=answering("new"))
    node.on_message(m("m1", "u1"), 0.0)
    assert route(node, m("m2", "u1"), 5.0) == ("new", {"reason": NOT_COMPLETED, "resolver": "new"})
    assert node.store.get(("guard", "u1")) == Entry(5.0, True, False)
    assert node.completed("m1", 6.0) is False  # the first run was superseded
    assert node.completed("m2", 6.0) is True
    assert outlink(node, m("m3", "u1"), 7.0) == "duplicate"


def test_resolver_new_for_a_too_long_uuid_is_not_recorded():
    node = HistoryNode("guard", resolver=answering("new"))
    assert outlink(node, m("m1", "x" * 97), 0.0) == "new"
    assert len(node.store) == 0


def test_resolver_that_raises_or_answers_neither_new_nor_duplicate_sends_to_failure():
    def broken(msg, doubt):
        raise RuntimeError("ledger down")

    node = HistoryNode("guard", resolver=broken)
    assert route(node, m("m1", "x" * 97), 0.0) == (
        "failure", {"reason": "resolver raised RuntimeError: ledger down", "doubt": TOO_LONG})
    for answer in ("maybe", "in_doubt", None):
        node = HistoryNode("guard", resolver=answering(answer))
        assert route(node, m("m1", "x" * 97), 0.0) == (
            "failure", {"reason": f"resolver returned {answer!r} (expected new or duplicate)", "doubt": TOO_LONG})


def test_a_duplicate_decision_is_recorded_so_the_message_is_not_in_doubt_again():
    seen = []
    node = HistoryNode("guard", completion="external", resolver=answering("duplicate", seen))
    node.on_message(m("m1", "u1"), 0.0)
    assert outlink(node, m("m2", "u1"), 1.0) == "duplicate"
    assert route(node, m("m3", "u1"), 2.0) == ("duplicate", {"reason": BOTH_ENTRIES})
    assert len(seen) == 1 and node.store.get(("guard", "u1")) == Entry(0.0, True, True)


def test_every_duplicate_and_in_doubt_verdict_is_a_journal_entry():
    node = HistoryNode("guard", completion="external")
    node.journal = []
    node.on_message(m("m1", "u1"), 0.0)
    node.on_message(m("m2", "u1"), 1.0)
    node.completed("m1", 2.0)
    node.on_message(m("m3", "u1"), 3.0)
    assert node.journal == [
        {"node": "guard", "id": "m2", "uuid": "u1", "status": "in_doubt", "reason": NOT_COMPLETED},
        {"node": "guard", "id": "m3", "uuid": "u1", "status": "duplicate", "reason": BOTH_ENTRIES}]


def test_finished_completes_by_uuid_a_message_this_node_did_not_send():
    sent = HistoryNode("guard", completion="external")
    sent.on_message(m("m1", "u1"), 0.0)
    node = HistoryNode("guard", completion="external")  # a new master, loaded from the first's state
    node.load_state(sent.changed_state())
    assert node.finished(Msg("m1", {"uuid": "u1"}), 1.0) is True
    assert node.finished(Msg("m1", {"uuid": "u1"}), 1.5) is False  # completed already
    assert route(node, m("m2", "u1"), 2.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_started_is_told_before_the_message_leaves_for_the_downstream():
    node = HistoryNode("guard", completion="external")
    told = []
    node.started = lambda key, entry: told.append((key, entry))
    node.on_message(m("m1", "u1"), 4.0)
    node.on_message(m("m2", "u1"), 5.0)  # In Doubt: nothing started
    assert told == [('started:["guard", "u1"]', 4.0)]
    # The step that runs the message removes the started entry; the history entry is written.
    assert node.changed_state() == {'["guard", "u1"]': [4.0, True, False], 'started:["guard", "u1"]': None}


def tracked(**kw) -> HistoryNode:
    node = HistoryNode("guard", completion="external", **kw)
    node.tracked = True  # as the engine sets it when a node is linked to `new`
    return node


# The seed: a "processing" entry alone means the service "might still be executing or the server
# might have unexpectedly shut down"; with a resolver Integration Server invokes it, without one the
# message is In Doubt and a journal entry says so.
def test_a_second_message_while_the_first_run_is_in_progress_is_in_doubt_without_a_resolver():
    node = tracked()
    node.journal = []
    node.on_message(m("m1", "u1"), 0.0)  # its handler waits for a retry downstream
    assert route(node, m("m2", "u1"), 1.0) == ("in_doubt", {"reason": IN_PROGRESS})
    assert node.journal == [{"node": "guard", "id": "m2", "uuid": "u1", "status": "in_doubt", "reason": IN_PROGRESS}]
    # Nothing recorded: the first run is still the one the history waits for.
    assert node.store.get(("guard", "u1")) == Entry(0.0, True, False)
    assert node.finished(m("m1", "u1"), 2.0) is True
    assert route(node, m("m3", "u1"), 3.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_the_resolver_is_asked_about_a_run_in_progress_and_told_so():
    seen = []
    node = tracked(resolver=answering("duplicate", seen))
    node.on_message(m("m1", "u1"), 0.0)
    node.on_message(m("m2", "u1"), 1.0)
    assert seen == [("m2", Doubt("guard", "u1", IN_PROGRESS, 0.0, 1.0))]


def test_a_resolver_that_answers_duplicate_for_a_run_in_progress_leaves_that_run_alone():
    node = tracked(resolver=answering("duplicate"))
    node.journal = []
    node.on_message(m("m1", "u1"), 0.0)
    assert route(node, m("m2", "u1"), 1.0) == ("duplicate", {"reason": IN_PROGRESS, "resolver": "duplicate"})
    assert node.journal == [{"node": "guard", "id": "m2", "uuid": "u1", "status": "in_doubt",
                             "reason": IN_PROGRESS, "resolver": "duplicate"}]
    assert node.store.get(("guard", "u1")) == Entry(0.0, True, True)  # decided: recorded completed
    # The first run ends later: its report finds the entry completed and records nothing.
    assert node.finished(m("m1", "u1"), 5.0) is False
    assert node.store.get(("guard", "u1")) == Entry(0.0, True, True)
    assert route(node, m("m3", "u1"), 6.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_a_resolver_that_answers_new_for_a_run_in_progress_runs_it_again():
    node = tracked(resolver=answering("new"))
    node.journal = []
    node.on_message(m("m1", "u1"), 0.0)
    assert route(node, m("m2", "u1"), 1.0) == ("new", {"reason": IN_PROGRESS, "resolver": "new"})
    assert node.journal == [{"node": "guard", "id": "m2", "uuid": "u1", "status": "in_doubt",
                             "reason": IN_PROGRESS, "resolver": "new"}]
    assert node.store.get(("guard", "u1")) == Entry(1.0, True, False)
    # The first run's end is not the second's: a third message still finds a run in progress.
    assert node.finished(m("m1", "u1"), 2.0) is False
    assert route(node, m("m3", "u1"), 3.0) == ("new", {"reason": IN_PROGRESS, "resolver": "new"})
    assert node.finished(m("m2", "u1"), 4.0) is False  # superseded by m3's run in turn
    assert node.finished(m("m3", "u1"), 5.0) is True
    assert node.store.get(("guard", "u1")) == Entry(3.0, True, True)


def test_a_new_master_does_not_take_the_first_runs_end_for_the_second_runs():
    first = tracked(resolver=answering("new"))
    first.on_message(m("m1", "u1"), 0.0)
    first.on_message(m("m2", "u1"), 1.0)  # run again over m1's, which waits for a retry downstream
    state = first.changed_state()
    assert state['rerun:["guard", "u1"]'] == "m2"
    node = tracked(resolver=answering("new"))  # promoted: it never sent either message
    node.load_state(state)
    assert node.finished(m("m1", "u1"), 2.0) is False  # the earlier run's late report
    assert node.store.get(("guard", "u1")) == Entry(1.0, True, False)
    assert node.finished(m("m2", "u1"), 3.0) is True
    assert node.changed_state() == {'["guard", "u1"]': [1.0, True, True], 'rerun:["guard", "u1"]': None}
    assert route(node, m("m3", "u1"), 4.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_a_rerun_entry_goes_with_its_history_entry():
    node = HistoryNode("guard", retention=10.0, completion="external", resolver=answering("new"))
    node.tracked = True
    node.on_message(m("m1", "u1"), 0.0)
    node.on_message(m("m2", "u1"), 1.0)
    node.changed_state()
    assert outlink(node, m("m3", "u2"), 11.0) == "new"  # u1 expired
    assert node.changed_state()['rerun:["guard", "u1"]'] is None
    assert outlink(node, m("m4", "u1"), 12.0) == "new"
    assert node.finished(m("m4", "u1"), 13.0) is True


def test_a_started_entry_whose_step_never_committed_loads_in_doubt_until_decided():
    seen = []
    node = tracked(resolver=answering("duplicate", seen))
    node.load_state({'started:["guard", "u1"]': 4.0})
    assert node.changed_state() == {}  # nothing is written until the message is decided
    assert route(node, m("m2", "u1"), 5.0) == ("duplicate", {"reason": MASTER_DIED, "resolver": "duplicate"})
    assert seen == [("m2", Doubt("guard", "u1", MASTER_DIED, 4.0, 5.0))]
    assert node.changed_state() == {'["guard", "u1"]': [4.0, True, True], 'started:["guard", "u1"]': None}
    assert route(node, m("m3", "u1"), 6.0) == ("duplicate", {"reason": BOTH_ENTRIES})


def test_the_reason_tells_a_dead_masters_run_from_a_run_in_progress_and_from_neither():
    node = tracked()
    node.load_state({'started:["guard", "dead"]': 4.0, '["guard", "live"]': [4.0, True, False]})
    assert route(node, m("m1", "dead"), 5.0) == ("in_doubt", {"reason": MASTER_DIED})
    assert route(node, m("m2", "live"), 5.0) == ("in_doubt", {"reason": IN_PROGRESS})
    untracked = HistoryNode("guard", completion="external")  # nothing reports the end: neither is known
    untracked.on_message(m("m3", "u1"), 0.0)
    assert route(untracked, m("m4", "u1"), 1.0) == ("in_doubt", {"reason": NOT_COMPLETED})
    assert len({MASTER_DIED, IN_PROGRESS, NOT_COMPLETED}) == 3


def test_a_started_entry_of_a_committed_step_is_only_removed():
    node = tracked()
    node.load_state({'["guard", "u1"]': [4.0, True, False], 'started:["guard", "u1"]': 4.0})
    assert node.changed_state() == {'started:["guard", "u1"]': None}
    assert route(node, m("m2", "u1"), 5.0) == ("in_doubt", {"reason": IN_PROGRESS})


def test_an_attempt_decided_by_the_resolver_is_journaled_with_its_answer():
    node = tracked(resolver=answering("new"))
    node.journal = []
    node.on_message(m("m1", "u1"), 0.0)
    assert node.decide(m("m1", "u1"), 1.0) == "new"
    assert node.journal == [{"node": "guard", "id": "m1", "uuid": "u1", "status": "in_doubt",
                             "reason": ATTEMPT_IN_DOUBT, "resolver": "new"}]


def test_a_doubted_entry_that_expires_takes_its_started_entry_with_it():
    node = HistoryNode("guard", retention=10.0, completion="external")
    node.tracked = True
    node.load_state({'started:["guard", "u1"]': 4.0})
    assert outlink(node, m("m2", "u2"), 20.0) == "new"
    assert node.changed_state()['started:["guard", "u1"]'] is None


def test_resolver_is_not_asked_about_new_or_duplicate_messages():
    seen = []
    node = HistoryNode("guard", resolver=answering("in_doubt", seen))
    node.on_message(m("m1", "u1"), 0.0)
    node.on_message(m("m2", "u1"), 1.0)
    assert seen == []


def test_constructor_refuses_bad_values():
    with pytest.raises(ValueError, match="retention"):
        HistoryNode("g", retention=0)
    with pytest.raises(ValueError, match="completion"):
        HistoryNode("g", completion="later")


# -- parameters ---------------------------------------------------------------------
def params(body: str) -> Params:
    """Node x's parameters from ``body`` (YAML lines), at their real lines of f.yaml (body starts on line 3)."""
    text = "nodes:\n  x:\n" + "".join(f"    {line}\n" for line in body.splitlines())
    doc = Doc(text, "f.yaml")
    return Params(doc, "", doc.value).section("nodes").section("x")


def ok_resolver(msg, doubt):
    return "new"


NOT_CALLABLE = 7


def test_build_defaults():
    node = build("x", params("{}"))
    assert (node.retention, node.uuid_path.parts, node.trigger, node.resolver, node.external) == (
        7200.0, ("uuid",), "x", None, False)
    assert node.outlinks == ("new", "duplicate", "in_doubt", "failure") and node.kind == "history"


def test_build_reads_every_parameter():
    node = build("x", params(
        "uuid: header.uuid\ntrigger: orders-trigger\nretention: 90\n"
        f"resolver: '{__name__}:ok_resolver'\ncompletion: external"))
    assert (node.retention, node.uuid_path.parts, node.trigger, node.resolver, node.external) == (
        90.0, ("header", "uuid"), "orders-trigger", ok_resolver, True)


def test_build_takes_a_store():
    store = MemoryHistoryStore()
    assert build("x", params("{}"), store=store).store is store


@pytest.mark.parametrize("text,line,field,reason", [
    ("retention: 5\nttl: 3", 4, "nodes.x.ttl", "unknown field"),
    ("retention: 0", 3, "nodes.x.retention", "must be seconds > 0"),
    ("uuid: a\nretention: -4", 4, "nodes.x.retention", "must be seconds > 0"),
    ("retention: soon", 3, "nodes.x.retention", "(got 'soon')"),
    ("completion: later", 3, "nodes.x.completion", "must be one of immediate, external"),
    ("uuid: 3", 3, "nodes.x.uuid", "must be a str"),
    ("uuid: './'", 3, "nodes.x.uuid", "empty field path"),
    ("trigger: 'a b'", 3, "nodes.x.trigger", "must be 1-64 letters"),
    ("resolver: nocolon", 3, "nodes.x.resolver", "must be 'package.module:function'"),
    ("resolver: 'no_such_module_xyz:f'", 3, "nodes.x.resolver", "cannot import"),
    (f"resolver: '{__name__}:NOT_CALLABLE'", 3, "nodes.x.resolver", "is not callable"),
])
def test_parameter_refusals_name_file_line_field_and_reason(text, line, field, reason):
    with pytest.raises(FlowFileError) as err:
        build("x", params(text))
    assert (err.value.file, err.value.line, err.value.field) == ("f.yaml", line, field)
    assert reason in err.value.reason


def test_a_flow_file_links_the_outlinks():
    graph = parse_graph("flow: f\nnodes:\n  guard:\n    type: history\n    retention: 30\n"
                        "    links: {new: deliver}\n  deliver: {type: action}\n")
    assert isinstance(graph.nodes["guard"], HistoryNode) and graph.links["guard"] == {"new": "deliver"}


# -- examples and docstrings ---------------------------------------------------------
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("history-*")))
def test_example_replays_as_expected(example):
    folder = EXAMPLES / example
    graph = load_graph(folder / "flow.yaml")
    got = list(replay(graph, (folder / "events.jsonl").read_text().splitlines()))
    expected = [json.loads(line) for line in (folder / "expected.jsonl").read_text().splitlines() if line]
    assert got == expected


def test_docstring_examples():
    result = doctest.testmod(history)
    assert result.attempted > 0 and result.failed == 0


# -- properties ------------------------------------------------------------------------
UUIDS = st.sampled_from(["u1", "u2", "u3", "u4", "u5", "x" * 97])


@settings(max_examples=200, deadline=None)
@given(st.lists(UUIDS, min_size=1, max_size=30).flatmap(
    lambda us: st.permutations(us + us).map(lambda p: (us, p))))
def test_duplicated_and_reordered_input_is_new_once_per_uuid(case):
    distinct_input, delivered = case
    node = HistoryNode("guard")
    news: list[str] = []
    for i, uuid in enumerate(delivered):
        out = outlink(node, m(f"m{i}", uuid), float(i))
        if len(uuid) > 96:
            assert out == "in_doubt"
        elif out == "new":
            news.append(uuid)
        else:
            assert out == "duplicate"
    assert sorted(news) == sorted({u for u in distinct_input if len(u) <= 96})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(UUIDS, st.floats(0, 30)), max_size=40), st.floats(1, 50))
def test_a_uuid_is_new_again_only_after_its_entries_expire(steps, retention):
    node = HistoryNode("guard", retention=retention)
    now, last_new = 0.0, {}
    for i, (uuid, gap) in enumerate(steps):
        now += gap
        out = outlink(node, m(f"m{i}", uuid), now)
        if len(uuid) > 96:
            assert out == "in_doubt"
            continue
        retained = uuid in last_new and last_new[uuid] > now - retention
        assert out == ("duplicate" if retained else "new")
        if out == "new":
            last_new[uuid] = now


# Each step: a message with a UUID, a completion report for an earlier
# message (by index), or a pause.
STEPS = st.lists(st.one_of(
    st.tuples(st.just("msg"), UUIDS),
    st.tuples(st.just("done"), st.integers(0, 12)),
    st.tuples(st.just("wait"), st.one_of(st.sampled_from([0.0, 1.0, 10.0]), st.floats(0, 20))),
), max_size=50)


@settings(max_examples=200, deadline=None)
@given(STEPS, st.floats(1, 30), st.booleans())
def test_external_completion_follows_the_seeds_table(steps, retention, reported):
    node = HistoryNode("guard", retention=retention, completion="external")
    node.tracked = reported  # a run known to be in progress is In Doubt all the same
    now, sent, model = 0.0, [], {}  # model: uuid -> [time, completed]
    for kind, arg in steps:
        for uuid in [u for u, (t, _) in model.items() if t <= now - retention]:
            del model[uuid]
        if kind == "wait":
            now += arg
        elif kind == "done":
            if arg < len(sent):
                msg_id, uuid, started, ran = sent[arg]
                entry = model.get(uuid)
                expect = ran and entry is not None and entry[0] == started and not entry[1]
                assert node.completed(msg_id, now) is expect
                if expect:
                    entry[1] = True
        else:
            msg_id = f"m{len(sent)}"
            out = outlink(node, m(msg_id, arg), now)
            sent.append((msg_id, arg, now, out == "new"))
            if len(arg) > 96:
                assert out == "in_doubt"
            elif arg not in model:
                assert out == "new"
                model[arg] = [now, False]
            else:
                assert out == ("duplicate" if model[arg][1] else "in_doubt")


DOCS = st.one_of(
    st.builds(lambda u: {"uuid": u}, UUIDS),
    st.just({}),
    st.builds(lambda v: {"uuid": v}, st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2))),
)
RESOLVERS = st.sampled_from([None, "new", "duplicate", "in_doubt", "junk", "raise"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(DOCS, st.sampled_from(["m1", "m2", "", "i" * 97]), st.floats(0, 10)), max_size=40),
       RESOLVERS, st.sampled_from(history.COMPLETIONS))
def test_every_message_leaves_once_through_a_known_outlink(messages, answer, completion):
    def resolver(msg, doubt):
        if answer == "raise":
            raise ValueError("no")
        return answer

    node = HistoryNode("guard", retention=15.0, completion=completion,
                       resolver=None if answer is None else resolver)
    now = 0.0
    for doc, msg_id, gap in messages:
        now += gap
        msg = Msg(msg_id, doc)
        emits = node.on_message(msg, now) + node.on_time(now)
        assert len(emits) == 1 and emits[0].msgs == (msg,)
        assert emits[0].outlink in node.outlinks
        bad = not isinstance(doc.get("uuid"), (str, type(None))) or (not doc.get("uuid") and not msg_id)
        doubt_refused = answer in ("in_doubt", "junk", "raise") and emits[0].info.get("doubt") is not None
        assert (emits[0].outlink == "failure") == (bad or doubt_refused)
        assert node.pending() == 0


def test_the_entries_kept_are_not_followed_by_the_collector():
    # Entries live for the whole retention: the collector's full passes must not walk them
    # (they took 20% of a master's step time under a burst when each was a NamedTuple).
    store = MemoryHistoryStore()
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5000):
        store.put(("t", f"u{i}"), PROCESSING, float(i))
        store.put(("t", f"u{i}"), COMPLETED, float(i))
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert store.get(("t", "u7")) == Entry(7.0, True, True) and store.get(("t", "u7")).completed
