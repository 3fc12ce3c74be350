"""The claim pair's rulesets as both peers read each message (runtime/nodes/sort/claim_rules.py):
which ruleset, the key, the claim ID; the bad input each refuses; its fast paths give what the
general ones do."""

import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinflow.runtime.fields import BadInput, Template
from twinflow.runtime.nodes.sort import Pattern, Ruleset
from twinflow.runtime.nodes.sort.claim_rules import ClaimRules
from twinflow.runtime.fields import FieldPath

RULES = ClaimRules((
    Ruleset("orders", Template("{n}"), match=Pattern(FieldPath("kind"), equals="order"), id=Template("o-{n}"),
            bake_time=5.0),
    Ruleset("payments", Template("{pay.seq}"), match=Pattern(FieldPath("kind"), equals="payment"), bake_time=3.0),
    Ruleset("acks", Template("{n}"), match=Pattern(FieldPath("kind"), equals="ack"), id=Template("{ref}"),
            type="claim"),
), "int", 100, "mid")


def test_the_first_ruleset_that_takes_a_message_builds_its_key_and_claim_id():
    assert RULES.classify({"kind": "order", "n": 7}) == ("orders", 7, "o-7")
    assert RULES.classify({"kind": "payment", "pay": {"seq": " 12 "}}) == ("payments", 12, "12")  # ID: the key
    assert RULES.classify({"kind": "ack", "n": 7, "ref": 31}) == ("acks", 7, "31")  # 31 and "31": one ID
    assert RULES.classify({"kind": "note"}) is None and RULES.classify({}) is None  # nohit
    assert (RULES.baking, RULES.claiming) == (("orders", "payments"), frozenset({"acks"}))


@pytest.mark.parametrize("doc, reason", [
    ({"kind": "order"}, "ruleset 'orders': message has no key field 'n'"),
    ({"kind": "order", "n": True}, "ruleset 'orders': key True is not an int"),
    ({"kind": "order", "n": 7.5}, "ruleset 'orders': key 7.5 is not an int"),
    ({"kind": "order", "n": "1" * 101}, "is longer than 100 digits"),
    ({"kind": "order", "n": 10 ** 101}, "longer than 100 digits"),
    ({"kind": "payment", "pay": 3}, "ruleset 'payments': message has no key field 'pay.seq'"),
    ({"kind": "ack", "n": 1}, "ruleset 'acks': message has no ID field 'ref'"),
    ({"kind": "ack", "n": 1, "ref": True}, "ruleset 'acks': ID True is not a non-empty string or integer"),
    ({"kind": "ack", "n": 1, "ref": 2.0}, "ruleset 'acks': ID 2.0 is not a non-empty string or integer"),
    ({"kind": "ack", "n": 1, "ref": ""}, "ruleset 'acks': ID is empty"),
    ({"kind": "ack", "n": 1, "ref": ["x"]}, "ruleset 'acks': ID ['x'] is not a non-empty string or integer"),
])
def test_a_key_or_claim_id_that_cannot_be_built_is_bad_input_naming_the_ruleset(doc, reason):
    with pytest.raises(BadInput) as err:
        RULES.classify(doc)
    assert reason in str(err.value)


SHORT = ClaimRules.short_form("seq", "int", "id", bake_time=5.0)


@given(st.one_of(st.integers(), st.text(min_size=1)), st.one_of(st.integers(), st.floats(allow_nan=False),
                                                                 st.text(max_size=5), st.booleans()))
def test_the_fast_paths_give_what_the_general_ones_do(msg_id, seq):
    """The short form's claim ID taken from decode, and a plain int key taken as it is, are what
    rendering the ID template and parse_key give (and both refuse the same keys)."""
    doc = {"id": msg_id, "seq": seq}
    general = ClaimRules(SHORT.rulesets, "int", 100)  # no id_path: renders the ID template
    try:
        want = general.classify(doc)
    except BadInput as exc:
        with pytest.raises(BadInput, match=re.escape(str(exc))):
            SHORT.classify(doc, str(msg_id))
        return
    assert SHORT.classify(doc, str(msg_id)) == want


def test_rules_cross_to_executors_intact():
    for rules in (RULES, SHORT):
        again = pickle.loads(pickle.dumps(rules))
        assert again.baking == rules.baking and again.classify({"kind": "order", "n": 3, "id": "a", "seq": 4}, "a") == \
            rules.classify({"kind": "order", "n": 3, "id": "a", "seq": 4}, "a")
