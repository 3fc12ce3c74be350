"""One flow format: the cluster's sections and the claim pair live in the flow graph file.

The example loads; every bad file is refused naming file, line, field and reason.
"""

import json
from pathlib import Path

import pytest

from twinflow.cluster.on_cluster import StartRefused, cluster_flow
from twinflow.runtime.flowgraph import FlowFileError, load_graph, parse_graph
from twinflow.runtime.store.flow_store import DELIVER_MAX_MESSAGES

GOOD = """\
flow: f1
uplink: {stream: up}
message: {id: id}
input: act
nodes:
  act:
    type: action
    sink: {stream: out}
  sort: {type: sort, pairs_with: act, key: seq, bake_time: 2}
"""


def test_example_flow_loads():
    g = load_graph(Path(__file__).parents[1] / "examples" / "cluster.yaml")
    assert g.name == "demo" and g.cluster.pair.bake_time == 5.0 and g.message.id_ttl == 604800
    assert list(g.nodes) == ["deliver"]  # the worker's half is not a node of the master's graph
    rules = g.cluster.message.claim_rules
    assert (rules.baking, rules.key_type) == (("all",), "int")
    assert rules.classify({"id": "a", "seq": "7"}) == ("all", 7, "a")  # the short form: the claim ID is the message ID


def test_defaults():
    g = parse_graph(GOOD)
    spec = g.cluster
    assert spec.pair.unclaimed_outlink == "done" and spec.pair.action == "act" and spec.pair.sort == "sort"
    assert spec.message.id_ttl == 7 * 86400  # the ID cache never grows without bound
    assert spec.session_timeout == 2.0
    # The limits that keep a peer safe: bounded batches, a lease below the session, a capped failure stream.
    assert spec.batch_bytes == 64 << 20 and spec.write_lease == 1.0 < spec.session_timeout
    assert (spec.message.max_depth, spec.message.max_number_digits) == (64, 100)
    assert spec.redis_checks == "refuse" and spec.wait_replicas == 0
    assert spec.failure_max_entries == 100_000
    assert (spec.batch_size, spec.max_batch_size) == (2000, 20_000)  # batches grow under a backlog
    assert spec.step_messages == DELIVER_MAX_MESSAGES  # a master step as long as the store allows
    assert g.nodes["act"].sink == "out"


def test_the_limits_are_read():
    g = parse_graph(GOOD.replace("message: {id: id}", "message: {id: id, max_depth: 8, max_number_digits: 20}")
                    + "cluster: {session_timeout: 4, write_lease: 3, wait_replicas: 1, redis_checks: warn}\n"
                    + "failure: {max_entries: 500}\n")
    spec = g.cluster
    assert (spec.message.max_depth, spec.message.max_number_digits) == (8, 20)
    assert (spec.write_lease, spec.wait_replicas, spec.redis_checks) == (3.0, 1, "warn")
    assert spec.failure_max_entries == 500


def test_step_messages_is_read_and_each_shard_keeps_it():
    from twinflow.runtime.shards import shard_graph

    for n in (1, 3, 1000):
        g = parse_graph(GOOD + f"cluster: {{step_messages: {n}}}\n")
        assert g.cluster.step_messages == n
    sharded = parse_graph(GOOD.replace("uplink: {stream: up}", 'uplink: {stream: up, shards: 2, shard_key: "{c}"}')
                          + "cluster: {step_messages: 7}\n")
    assert shard_graph(sharded, 1).cluster.step_messages == 7  # an executor's shard task steps the same


def test_shards_and_their_names_keys_and_routing():
    from twinflow.cluster.on_cluster import flow_keys
    from twinflow.runtime.shards import ShardRouter, shard_graph

    g = parse_graph(GOOD.replace("uplink: {stream: up}", 'uplink: {stream: up, shards: 3, shard_key: "{c.id}"}'))
    assert (g.cluster.shards, g.cluster.shard_key) == (3, "{c.id}")
    keys = [flow_keys(shard_graph(g, k)) for k in range(3)]
    # Each shard under its own hash tag, so each can live on its own Redis Cluster node.
    assert [k.uplink for k in keys] == ["tf:{f1.s0}:up", "tf:{f1.s1}:up", "tf:{f1.s2}:up"]
    assert keys[2].sink == "tf:{f1.s2}:out"
    router = ShardRouter(3, g.cluster.shard_key)
    docs = [json.dumps({"id": i, "c": {"id": f"cust{i % 7}"}}).encode() for i in range(300)]
    shard_of = [router.shard_of(d) for d in docs]
    assert set(shard_of) == {0, 1, 2}  # spread over every shard ...
    assert all(shard_of[i] == shard_of[i % 7] for i in range(300))  # ... the same key always to the same one
    # Bad bodies and missing keys are not refused or dropped: shard 0 reports them.
    assert [router.shard_of(b) for b in (b"not json", b"[1]", b'{"id": 1}')] == [0, 0, 0]
    split = router.split(docs[:10])
    assert sorted(i for items in split.values() for i, _ in items) == list(range(10))
    one = parse_graph(GOOD)
    assert one.cluster.shards == 1 and flow_keys(shard_graph(one, 0)).uplink == "tf:{f1}:up"


def test_a_flow_without_a_pair_runs_on_the_cluster_and_one_without_an_uplink_only_in_replay():
    no_pair = parse_graph(GOOD.replace("  sort: {type: sort, pairs_with: act, key: seq, bake_time: 2}\n", ""))
    assert no_pair.cluster.pair is None and no_pair.cluster.message.key_path is None
    assert cluster_flow(no_pair) is no_pair.cluster
    replay_only = parse_graph("flow: f\nnodes:\n  a: {type: action}\n")
    assert replay_only.cluster is None
    with pytest.raises(StartRefused, match="no uplink section"):
        cluster_flow(replay_only)


def test_external_completion_runs_on_the_cluster_only_with_a_handler_linked_to_new():
    guarded = GOOD.replace("input: act\n", "input: guard\n")
    g = parse_graph(guarded.replace("nodes:\n", "nodes:\n  guard: {type: history, completion: external, links: {new: act}}\n"))
    assert cluster_flow(g) is g.cluster
    g = parse_graph(guarded.replace("nodes:\n", "nodes:\n  guard: {type: history, completion: external, "
                                                 "links: {duplicate: act}}\n"))
    with pytest.raises(StartRefused, match=r"nodes.guard: completion: external needs a node linked to its 'new'"):
        cluster_flow(g)


@pytest.mark.parametrize("old, new, line, field, reason", [
    ("bake_time: 2", "bake_time: 0", 9, "nodes.sort.bake_time", "must be seconds"),
    ("bake_time: 2", "bake_time: soon", 9, "nodes.sort.bake_time", "(got 'soon')"),
    ("pairs_with: act", "pairs_with: nobody", 9, "nodes.sort.pairs_with", "must name an action node"),
    ("key: seq, ", "", 9, "nodes.sort.key", "is required"),
    ("bake_time: 2", "bake_time: 2, rulesets: []", 9, "nodes.sort.key", "only without rulesets"),
    ("bake_time: 2", "bake_time: 2, xa_mode: 0", 9, "nodes.sort.xa_mode", "xa_mode 0 is refused: the uplink is never trimmed"),
    ("bake_time: 2", "bake_time: 2, outlinks: [a, b, c]", 9, "nodes.sort.outlinks", "exactly four"),
    ("uplink: {stream: up}", "uplink: {stream: up, extra: 1}", 2, "uplink.extra", "unknown field"),
    ("flow: f1", "flow: 'has space'", 1, "flow", "letters, digits"),
    ("    type: action", "    type: teleport", 7, "nodes.act.type", "must be one of"),
    ("    sink: {stream: out}", "    sink: {}", 8, "nodes.act.sink.stream", "is required"),
    ("input: act", "input: sort", 4, "input", "not the worker's half"),
    ("    sink: {stream: out}", "    sink: {stream: out}\n    links: {done: sort}", 9, "nodes.act.links.done",
     "the worker's half of the claim pair"),
    ("uplink: {stream: up}\n", "", 1, "uplink", "is required: node 'sort' pairs with 'act'"),
    ("uplink: {stream: up}", "uplink: {stream: up, batch_bytes: 100}", 2, "uplink.batch_bytes", "1-256 MiB"),
    ("uplink: {stream: up}", "uplink: {stream: up, batch_size: 500, max_batch_size: 100}", 2,
     "uplink.max_batch_size", "must be batch_size (500)"),
    ("uplink: {stream: up}\nmessage: {id: id}",
     "uplink: {stream: up, batch_bytes: 2097152}\nmessage: {id: id, max_bytes: 4194304}", 2,
     "uplink.batch_bytes", "at least message.max_bytes"),
    ("message: {id: id}", "message: {id: id, max_depth: 0}", 3, "message.max_depth", "1..1000"),
    ("message: {id: id}", "message: {id: id, id_ttl: 0}", 3, "message.id_ttl", "never unbounded"),
    ("flow: f1", "flow: f1\ncluster: {write_lease: 2}", 2, "cluster.write_lease", "session_timeout"),
    ("flow: f1", "flow: f1\ncluster: {redis_checks: maybe}", 2, "cluster.redis_checks", "refuse, warn"),
    ("flow: f1", "flow: f1\ncluster: {step_messages: 0}", 2, "cluster.step_messages", "must be 1..1000"),
    ("flow: f1", "flow: f1\ncluster: {step_messages: 1001}", 2, "cluster.step_messages", "must be 1..1000"),
    ("flow: f1", "flow: f1\ncluster: {step_messages: 2.5}", 2, "cluster.step_messages", "must be a int"),
    ("flow: f1", "flow: f1\ncluster: {step_messages: true}", 2, "cluster.step_messages", "must be a int"),
    ("uplink: {stream: up}", "uplink: {stream: up, shards: 2}", 2, "uplink.shard_key", "is required with shards"),
    ("uplink: {stream: up}", "uplink: {stream: up, shards: 0}", 2, "uplink.shards", "1..256"),
    ("uplink: {stream: up}", "uplink: {stream: up, shards: 2, shard_key: plain}", 2, "uplink.shard_key",
     "names no field"),
])
def test_bad_field_is_refused_with_line_field_and_reason(old, new, line, field, reason):
    assert_refused(GOOD, old, new, line, field, reason)


def assert_refused(good: str, old: str, new: str, line: int, field: str, reason: str) -> None:
    """``good`` with ``old`` made ``new`` is refused at ``line``, naming ``field`` and ``reason``."""
    text = good.replace(old, new)
    assert text != good
    with pytest.raises(FlowFileError) as err:
        parse_graph(text, "bad.yaml")
    e = err.value
    assert (e.file, e.line, e.field) == ("bad.yaml", line, field), str(e)
    assert reason in e.reason, str(e)
    assert str(e).startswith(f"bad.yaml:{line}: {field}: ")


def test_cluster_sections_need_an_uplink():
    with pytest.raises(FlowFileError, match="only with an uplink section"):
        parse_graph("flow: f\nnodes:\n  a: {type: action}\ncluster: {session_timeout: 2}\n")


def test_broken_yaml_and_missing_file():
    with pytest.raises(FlowFileError, match="not valid YAML"):
        parse_graph("flow: [\n", "x.yaml")
    with pytest.raises(FlowFileError, match="cannot be read"):
        load_graph("/nonexistent/flow.yaml")


def test_one_claim_pair_per_flow():
    text = GOOD + "  sort2: {type: sort, pairs_with: act, key: seq}\n"
    with pytest.raises(FlowFileError, match="already pairs with"):
        parse_graph(text)


RULESETS = """\
flow: f2
uplink: {stream: up}
message: {id: mid}
input: act
nodes:
  act: {type: action, sink: {stream: out}}
  sort:
    type: sort
    pairs_with: act
    rulesets:
      - {name: orders, match: {field: kind, equals: order}, key: "{n}", id: "o-{n}", bake_time: 5}
      - {name: payments, match: {field: kind, equals: payment}, key: "{pay.seq}", bake_time: 3}
      - {name: acks, type: claim, match: {field: kind, equals: ack}, key: "{n}", id: "o-{n}"}
"""


def test_a_claim_pair_with_rulesets_loads_and_reads_each_message_by_its_ruleset():
    g = parse_graph(RULESETS)
    rules = g.cluster.message.claim_rules
    assert g.cluster.pair.rules is rules and rules.baking == ("orders", "payments")
    assert rules.bake_times() == {"orders": 5.0, "payments": 3.0} and g.cluster.pair.bake_time == 5.0
    assert rules.classify({"kind": "order", "n": 7}) == ("orders", 7, "o-7")
    assert rules.classify({"kind": "payment", "pay": {"seq": "4"}}) == ("payments", 4, "4")  # no id: the key
    assert rules.classify({"kind": "ack", "n": 7}) == ("acks", 7, "o-7")
    assert rules.classify({"kind": "note"}) is None  # nohit
    assert [p.path for p in rules.fields()] == ["kind", "n", "pay.seq"]


@pytest.mark.parametrize("old, new, line, field, reason", [
    ('key: "{n}", id: "o-{n}", bake_time: 5}', 'key: "{n}", id: "o-{n}", bake_time: 5, key_type: str}', 11,
     "nodes.sort.rulesets[0].key_type", "must be the node's key_type (int)"),
    ('      - {name: orders, match: {field: kind, equals: order}, key: "{n}", id: "o-{n}", bake_time: 5}\n'
     '      - {name: payments, match: {field: kind, equals: payment}, key: "{pay.seq}", bake_time: 3}\n', "", 11,
     "nodes.sort.rulesets", "needs a ruleset of type sort"),
    ("    rulesets:", "    key: seq\n    rulesets:", 10, "nodes.sort.key", "only without rulesets"),
    ('key: "{pay.seq}", bake_time: 3}', 'key: "{pay.seq}"}', 12, "nodes.sort.rulesets[1].bake_time",
     "claim mode needs bake_time > 0"),
    ('id: "o-{n}"}', 'id: "o-{n}", bake_time: 1}', 13, "nodes.sort.rulesets[2].bake_time", "no meaning on a claim"),
    ("name: payments", "name: orders", 12, "nodes.sort.rulesets[1].name", "already named 'orders'"),
    ("name: payments", "name: nohit", 12, "nodes.sort.rulesets[1].name", "implicit ruleset"),
    ('bake_time: 3}', 'bake_time: 3, xa_mode: 0}', 12, "nodes.sort.rulesets[1].xa_mode", "xa_mode 0 is refused"),
    ('bake_time: 3}', 'bake_time: 90000}', 12, "nodes.sort.rulesets[1].bake_time", "(0, 86400]"),
    ("    rulesets:", "    outlinks: [a, b, a, d]\n    rulesets:", 10, "nodes.sort.outlinks", "four different"),
    ("    rulesets:", "    xa_mode: 0\n    rulesets:", 10, "nodes.sort.xa_mode", "xa_mode 0 is refused"),
])
def test_a_bad_ruleset_of_the_pair_is_refused_with_line_field_and_reason(old, new, line, field, reason):
    assert_refused(RULESETS, old, new, line, field, reason)


def test_the_pair_outlinks_may_carry_any_names():
    g = parse_graph(RULESETS.replace("    rulesets:", "    outlinks: [sorted, late, broken, other]\n    rulesets:"))
    pair = g.cluster.pair
    assert pair.names == ("sorted", "late", "broken", "other") and pair.outlink_name("done") == "sorted"
