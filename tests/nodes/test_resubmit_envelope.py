"""The resubmit envelope as decode reads it: the inner message under an identity and a claim ID of
its own, the original ID and document for the nodes, and every hostile envelope refused as bad
input with its reason."""

import json

import pytest

from twinflow.runtime.fields import BadInput
from twinflow.runtime.message import MessageSpec, Resubmitted, decode
from twinflow.runtime.resubmit import envelope

SPEC = MessageSpec(id_path="meta.id", key_path="seq", key_type="int")
AUDIT = "1700000000000-4"


def test_an_envelope_is_the_inner_message_under_its_own_identity():
    original = decode("5-0", b'{"meta": {"id": "o7"}, "seq": 3}', SPEC)
    m = decode("9-0", envelope(AUDIT, "deliver", {"meta": {"id": "o7"}, "seq": 3}), SPEC)
    assert isinstance(m, Resubmitted)
    assert (m.id, m.original_id, m.audit, m.node, m.position) == (f"o7~resubmit:{AUDIT}", "o7", AUDIT, "deliver", "9-0")
    assert m.id != original.id and m.cid != original.cid  # the ID cache and the claims see a new message
    assert (m.rule, m.key, m.cid) == (original.rule, original.key, f"o7~resubmit:{AUDIT}")  # classified by its document
    nodes_see = m.msg()
    assert (nodes_see.id, dict(nodes_see.doc)) == ("o7", {"meta": {"id": "o7"}, "seq": 3})  # what failed, as it was


def test_two_audit_entries_of_one_message_are_two_identities():
    doc = {"meta": {"id": 5}, "seq": 1}
    a, b = (decode("9-0", envelope(audit, "", doc), SPEC) for audit in ("1-0", "2-0"))
    assert (a.id, b.id) == ("5~resubmit:1-0", "5~resubmit:2-0") and a.msg().id == b.msg().id == "5"
    assert a.node == "" and a.msg().id == "5"  # an integer ID is its text, as for any message


def test_the_id_the_node_saw_comes_from_the_envelope_when_it_has_one():
    group = {"ids": ["o1", "p1"], "messages": [{"id": "o1"}, {"id": "p1"}]}  # a join's group: no ID field
    m = decode("9-0", envelope(AUDIT, "deliver", group, "o1+p1"), MessageSpec())
    assert (m.id, m.msg().id, dict(m.msg().doc)) == (f"o1+p1~resubmit:{AUDIT}", "o1+p1", group)


def test_a_flow_without_a_claim_pair_has_no_claim_for_it():
    m = decode("9-0", envelope(AUDIT, "a", {"id": "x"}), MessageSpec())
    assert (m.rule, m.cid, m.key, m.id) == (None, None, None, f"x~resubmit:{AUDIT}")


def body(head, message=None, **extra) -> bytes:
    doc = {"twinflow_resubmit": head, **extra}
    if message is not None:
        doc["message"] = message
    return json.dumps(doc).encode()


GOOD_INNER = {"meta": {"id": "o1"}, "seq": 1}


@pytest.mark.parametrize("data, reason", [
    (body("1-0", GOOD_INNER), "twinflow_resubmit must be an object (got a string)"),
    (body(None, GOOD_INNER), "twinflow_resubmit must be an object (got null)"),
    (body({"node": "a"}, GOOD_INNER), "twinflow_resubmit.audit must be an audit ID"),
    (body({"audit": 17, "node": "a"}, GOOD_INNER), "twinflow_resubmit.audit must be an audit ID"),
    (body({"audit": "1-0; DROP", "node": "a"}, GOOD_INNER), "must be an audit ID such as"),
    (body({"audit": "1-0", "node": ["a"]}, GOOD_INNER), "twinflow_resubmit.node must be a node name"),
    (body({"audit": "1-0", "node": "a b"}, GOOD_INNER), "twinflow_resubmit.node must be a node name"),
    (body({"audit": "1-0", "node": "a"}), "it has no message"),
    (body({"audit": "1-0", "node": "a", "id": ""}, GOOD_INNER), "twinflow_resubmit.id must be a non-empty string"),
    (body({"audit": "1-0", "node": "a", "id": 7}, GOOD_INNER), "twinflow_resubmit.id must be a non-empty string"),
    (body({"audit": "1-0", "node": "a"}, [1, 2]), "message must be a JSON object (got an array)"),
    (body({"audit": "1-0", "node": "a"}, GOOD_INNER, extra=1), "unexpected field 'extra'"),
    (body({"audit": "1-0", "node": "a"}, {"seq": 1}), "no ID field 'meta.id'"),
    (body({"audit": "1-0", "node": "a"}, {"meta": {"id": "o"}}), "no key field 'seq'"),
    (body({"audit": "1-0", "node": "a"}, {"meta": {"id": "o"}, "seq": 1,
                                          "twinflow_resubmit": {"audit": "2-0"}}), "is an envelope itself"),
])
def test_a_hostile_envelope_is_bad_input_with_its_reason(data, reason):
    with pytest.raises(BadInput) as err:
        decode("9-0", data, SPEC)
    assert reason in err.value.reason, err.value.reason


def test_the_workers_claim_sort_holds_a_resubmit_until_its_own_claim():
    from twinflow.runtime.nodes.sort.claim import ClaimSortNode

    spec = MessageSpec(key_path="seq")
    m = decode("20-0", envelope(AUDIT, "deliver", {"id": "o7", "seq": 3}, "o7"), spec)
    node = ClaimSortNode(bake_time=5.0)
    assert node.offer(m, now=0.0) is None and node.baked == 1
    assert node.claim("o7", 3, "10-0", "all") == []  # the original's claim, earlier in the uplink: not this one
    assert [x.id for x in node.claim(m.cid, m.key, m.position, m.rule)] == [m.id] and node.baked == 0
