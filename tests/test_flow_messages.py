"""Messages made from a flow file's own fields (twinflow/testing/flow_messages.py): what
`twinflow simulate --flow` and `twinflow drill --flow` publish for a flow that does not name
its fields as the built-in orders and payments do."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.message import decode
from twinflow.runtime.shards import ShardRouter
from twinflow.testing.flow_messages import (CHAINED_MESSAGES, CannotGenerate, FlowMessages, SamplesError,
                                            messages_for, read_samples)
from twinflow.testing.messages import order_or_payment

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def renamed_sharded() -> str:
    """examples/cluster-sharded.yaml with every field renamed: ID mid, sort key n, shard key {oid}."""
    text = (EXAMPLES / "cluster-sharded.yaml").read_text()
    for old, new in (('shard_key: "{order_id}"', 'shard_key: "{oid}"'), ("message: {id: id,", "message: {id: mid,"),
                     ("uuid: uuid ", "uuid: ref "), ("type_field: type", "type_field: kind"),
                     ("activation_field: order_id", "activation_field: oid"), ("key: seq", "key: n")):
        assert old in text
        text = text.replace(old, new)
    return text


CLAIM_RULESETS = """
flow: rules
uplink: {stream: uplink}
message: {id: meta.id}
input: deliver
nodes:
  deliver: {type: action, sink: {stream: sink}}
  claims:
    type: sort
    pairs_with: deliver
    key_type: str
    rulesets:
      - {name: orders, match: {field: doc.kind, regex: "^ORD-[0-9]{3}$"}, key: "{region}-{n}", id: "o-{ref}",
         bake_time: 5}
      - {name: payments, match: {field: doc.kind, equals: payment}, key: "{pay.seq}", bake_time: 3}
      - {name: acks, type: claim, match: {field: doc.kind, equals: ack}, key: "{n}"}
"""


def test_messages_of_a_renamed_flow_decode_spread_over_the_shards_and_meet_in_the_join():
    graph = parse_graph(renamed_sharded(), "renamed.yaml")
    source = messages_for(graph)
    assert isinstance(source, FlowMessages)
    docs = [source.doc(i) for i in range(200)]
    assert docs[0] == {"mid": "m000000", "n": 0, "ref": "doc-0", "kind": "order", "oid": 0}
    decoded = [decode(f"1-{i}", json.dumps(d).encode(), graph.cluster.message) for i, d in enumerate(docs)]
    assert [m.id for m in decoded] == [source.id_of(d) for d in docs] and len({m.id for m in decoded}) == 200
    keys = [m.key for m in decoded]
    assert keys == sorted(keys) and len(set(keys)) == 200           # the claim pair's key grows
    router = ShardRouter(graph.cluster.shards, graph.cluster.shard_key)
    shards = [router.shard_of(json.dumps(d).encode()) for d in docs]
    assert set(Counter(shards)) == {0, 1} and min(Counter(shards).values()) > 50
    by_activation = defaultdict(set)
    for d, shard in zip(docs, shards):
        by_activation[d["oid"]].add(shard)
    assert all(len(s) == 1 for s in by_activation.values())       # an order and its payment share a shard
    kinds = Counter(d["kind"] for d in docs)
    assert kinds == {"order": 120, "payment": 80}                  # one order in ten alone, one sent again
    again = [d for d in docs if sum(e["ref"] == d["ref"] for e in docs) > 1]
    assert again and all(d["kind"] == "order" for d in again)      # the history's duplicates


def test_the_built_in_kinds_keep_their_own_messages():
    for name in ("cluster.yaml", "cluster-chained.yaml", "cluster-sharded.yaml", "cluster-every-node.yaml"):
        assert messages_for(parse_graph((EXAMPLES / name).read_text(), name)) is CHAINED_MESSAGES
    assert [CHAINED_MESSAGES.doc(i) for i in range(30)] == [order_or_payment(i) for i in range(30)]
    assert CHAINED_MESSAGES.resent(order_or_payment(0), 3) == {**order_or_payment(0), "id": "r00003"}


def test_rulesets_nested_paths_and_text_keys():
    graph = parse_graph(CLAIM_RULESETS, "rules.yaml")
    source = messages_for(graph)
    rules = Counter()
    last: dict = {}
    for i in range(90):
        m = decode(f"1-{i}", json.dumps(source.doc(i)).encode(), graph.cluster.message)
        assert m.id == f"m{i:06d}" and source.doc(i)["meta"] == {"id": m.id}
        rules[m.rule] += 1
        if m.rule is not None:
            assert m.rule not in last or m.key > last[m.rule]       # str keys grow too
            last[m.rule] = m.key
    assert rules == {"orders": 23, "payments": 23, "acks": 22, None: 22}  # each ruleset in turn, and nohit
    assert source.doc(0)["doc"]["kind"] == "ORD-000"                  # made from the regex


@pytest.mark.parametrize("change, field", [
    ('regex: "^ORD-[0-9]{3}$"', "doc.kind"),                  # a back-reference: no made-up text
    ("{field: doc.kind, equals: payment}", "pay.seq"),        # an equals on the key field
])
def test_what_cannot_be_made_up_names_its_field(change, field):
    replacement = {'regex: "^ORD-[0-9]{3}$"': 'regex: "^(a)\\\\1$"',
                   "{field: doc.kind, equals: payment}": "{field: pay.seq, equals: 7}"}[change]
    graph = parse_graph(CLAIM_RULESETS.replace(change, replacement), "rules.yaml")
    with pytest.raises(CannotGenerate) as err:
        messages_for(graph)
    assert err.value.field == field and str(err.value).startswith(f"field '{field}': ")


def test_samples_are_copied_with_a_fresh_id_and_a_growing_key(tmp_path):
    graph = parse_graph(CLAIM_RULESETS.replace('regex: "^ORD-[0-9]{3}$"', 'regex: "^(a)\\\\1$"'), "rules.yaml")
    path = tmp_path / "samples.jsonl"
    path.write_text('{"meta": {"id": "x"}, "region": "eu", "n": "1", "ref": "r", "doc": {"kind": "aa"}, "amount": 3}\n'
                    '\n{"meta": {"id": "y"}, "pay": {"seq": "9"}, "doc": {"kind": "payment"}}\n')
    source = messages_for(graph, read_samples(path))
    docs = [source.doc(i) for i in range(6)]
    assert docs[0] == {"meta": {"id": "m000000"}, "region": "eu", "n": "000000000", "ref": "c0",
                       "doc": {"kind": "aa"}, "amount": 3, "pay": {"seq": "000000000"}}
    decoded = [decode(f"1-{i}", json.dumps(d).encode(), graph.cluster.message) for i, d in enumerate(docs)]
    assert [m.rule for m in decoded] == ["orders", "payments"] * 3
    assert len({m.id for m in decoded}) == 6 and [m.key for m in decoded[::2]] == sorted(m.key for m in decoded[::2])
    path.write_text('{"meta": {"id": "x"}}\n[1]\n')
    with pytest.raises(SamplesError, match="line 2: not a JSON object"):
        read_samples(path)
