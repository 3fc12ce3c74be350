"""One flow file, one meaning: what `twinflow validate` accepts replays, and what replay refuses,
`validate` refuses with the same field and reason.

Three sources of flow files:

- every example flow: a file `validate` accepts (for the cluster when it has an uplink, for replay
  when not) loads for replay and replays messages, each of which leaves the flow;
- flows generated from each node kind's options (one option at a time over good and bad values,
  then hypothesis' combinations), each written twice, as a replay flow and as a cluster flow: the
  node's refusal is the same field and reason in both, replay's refusal is among `validate`'s,
  and a cluster file `validate` accepts replays;
- the sort node's options as replay's claim-mode sort and as the cluster's claim pair (the same
  section with ``pairs_with``): the same field and reason, but for the options only one side
  has, each listed below with why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.cli_validate import refusals_of
from twinflow.runtime.cluster_spec import REPLAY_SORT_ONLY
from twinflow.runtime.flowgraph import check_file, load_graph
from twinflow.runtime.params import FlowFileError
from twinflow.runtime.replay import replay

EXAMPLES = Path(__file__).parents[1] / "examples"
EXAMPLE_FLOWS = sorted(EXAMPLES.glob("*/flow.yaml")) + sorted(EXAMPLES.glob("*.yaml"))

# Each kind: a section that loads, and values for its options, good and bad alike.
KINDS: dict[str, tuple[dict, dict[str, list]]] = {
    "join": ({"types": ["a", "b"], "activation_field": "k", "timeout": 5}, {
        "join_type": ["and", "or", "xor", "nand"],
        "types": [["a"], ["a", "a"], ["a", "b", "a"], [], "a", [1]],
        "type_field": ["kind", "meta.kind", "", 3],
        "activation_field": ["k", "", None],
        "timeout": [5, 0, -1, "5s", "soon"],
        "duplicate": ["keep_first", "keep_last", "keep_none"],
    }),
    "history": ({"retention": 60}, {
        "uuid": ["uuid", "header.uuid", "", 7],
        "trigger": ["t1", "", "a b"],
        "retention": [60, 0, "2h", "never"],
        "completion": ["immediate", "external", "eventually"],
        "resolver": ["no_such_module:f", 5],
    }),
    "resequence": ({"sequence_number": "seq", "end": {"literal": 3}, "missing_message_timeout": 5}, {
        "sequence_number": ["seq", ""],
        "group": ["batch", ""],
        "start": [1, 0, -1, "one"],
        "end": [{"literal": 3}, {"automatic": 10}, {"predicate": {"field": "last", "equals": True}}, {}, 3],
        "missing_message_timeout": [5, 0, -5],
        "idle_timeout": [30, 0, "x"],
    }),
    "sequence": ({"group": "g"}, {
        "group": ["g", ""],
        "start": [1, 0, "one"],
        "end": [{"literal": 3}, {"automatic": 10}, {"predicate": {"field": "kind", "in": ["final"]}},
                {"literal": 3, "automatic": 2}],
        "idle_timeout": [30, -1],
    }),
    "aggregate": ({"completion": "general", "timeout": 60}, {
        "completion": ["general", "timely_and_reliable", "variable", "sometimes"],
        "timeout": [60, 0, {"timely_and_reliable": 600, "general": 3600}, {"general": 1}],
        "fields": [{}, {"recipient": "to"}, {"nonsense": "x"}],
    }),
    "action": ({"sink": {"stream": "out"}}, {
        "handler": ["no_such_module:f", "nocolon"],
        "transient": [["TimeoutError"], "TimeoutError"],
        "retry_interval": [2, 0, -1],
        "max_retries": [1, 0, -1, 2.5],
        "sink": [{"stream": "out"}, {"stream": ""}, {}, "out"],
        "on_retry_failure": ["failure", "suspend", "drop"],
        "suspend_for": [60, 0],
    }),
}

# The claim pair: a sort whose every option below means the same with pairs_with and without.
CLAIM_RULESETS = [{"name": "esc", "type": "claim", "match": {"field": "kind", "equals": "esc"}, "key": "{n}"},
                  {"name": "orders", "key": "{n}", "bake_time": 5}]
SORT_OPTIONS: dict[str, list] = {
    "key_type": ["int", "float", "str", "decimal"],
    "xa_mode": [1, 0, 2, "1"],
    "unclaimed_outlink": ["done", "failure", "nohit"],
    "max_pending": [10, 0, "many"],
    "outlinks": [["a", "b", "c", "d"], ["a", "b", "c"], ["a", "a", "b", "c"]],
}
RULESET_OPTIONS: dict[str, list] = {
    "xa_mode": [1, 0, 2],
    "bake_time": [5, 0, -1, 86400, 86401, "5"],
    "session_timeout": [0, 3],
    "key_type": ["int", "float"],
    "key": ["{n}", "", "{n"],
    "id": ["{ref}", "ord-{n}", ""],
    "type": ["sort", "claim", "sieve"],
    "match": [{"field": "kind", "equals": "order"}, {"field": "kind"}, {"field": "kind", "regex": "("}],
}
# Options one side alone has: replay's `id_ttl` and `rollback_on` (the cluster keeps the ID cache
# for the flow's `message.id_ttl`, and a promotion is the rollback: the pair refuses each, saying
# so), the pair's `pairs_with` and its short form, `key` and `bake_time` (replay never feeds it).


def flow_text(kind: str, section: dict, cluster: bool) -> str:
    """A flow of one node of ``kind`` (with an action after it on the cluster, as every cluster flow
    delivers somewhere), or for ``kind`` "pair", replay's claim-mode sort or the cluster's pair."""
    nodes: dict = {}
    if kind == "pair":
        nodes["sort"] = {"type": "sort", **section}
        if cluster:
            nodes = {"act": {"type": "action", "sink": {"stream": "out"}},
                     "sort": {**nodes["sort"], "pairs_with": "act"}}
    else:
        nodes["node"] = {"type": kind, **section}
    doc = {"flow": "f", "message": {"id": "id"}, "nodes": nodes}
    if cluster:
        doc["uplink"] = {"stream": "up"}
    return yaml.safe_dump(doc, sort_keys=False)


def refusal(path: Path) -> tuple[str, str] | None:
    """What replay's load refuses first, as (field, reason); None when it loads."""
    try:
        load_graph(path)
    except FlowFileError as exc:
        return exc.field, exc.reason
    return None


def node_refusals(path: Path) -> set[tuple[str, str]]:
    """`validate`'s refusals of the file's node sections, without the cluster's start checks
    (which refuse, by design, what runs in replay only)."""
    return {(e.field, e.reason) for e in check_file(path)[1] if e.field.startswith("nodes.")}


def replays(path: Path, n: int = 12) -> None:
    """``path`` loads for replay and every message of a few leaves the flow (or is refused as bad)."""
    graph = load_graph(path)
    id_field = graph.id_path.path
    lines = [json.dumps({"at": i * 0.5, id_field: f"m{i}", "n": i, "seq": i, "kind": "order", "type": "a",
                         "k": i % 3, "group": "g", "g": "g", "uuid": f"u{i % 4}", "ref": f"m{i - 1}"})
             for i in range(n)]
    bad: set[str] = set()
    out = list(replay(graph, lines, on_bad=lambda line, why: bad.add(f"m{line - 1}")))
    assert {e["id"] for e in out} | bad >= {f"m{i}" for i in range(n)}, (path, out)


def check_agreement(kind: str, section: dict, tmp: Path) -> tuple[bool, bool]:
    """The file written both ways agrees; returns whether each way was accepted."""
    for_replay, for_cluster = tmp / "replay.yaml", tmp / "cluster.yaml"
    for_replay.write_text(flow_text(kind, section, cluster=False))
    for_cluster.write_text(flow_text(kind, section, cluster=True))
    found = {}
    for path, replay_only in ((for_replay, True), (for_cluster, False)):
        first = refusal(path)
        validated = refusals_of(str(path), replay_only)
        if first is not None:  # what replay refuses, validate refuses with the same field and reason
            assert first in {(e.field, e.reason) for e in validated}, (path.read_text(), first, validated)
        elif not validated:    # what validate accepts, replay loads and runs
            replays(path)
        found[replay_only] = first
    # One node option, one meaning: the node's refusals are the same field and reason both ways.
    assert node_refusals(for_replay) == node_refusals(for_cluster), section
    return found[True] is None, found[False] is None


# -- every example flow ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", EXAMPLE_FLOWS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_an_example_validate_accepts_replays(path):
    cluster = "uplink" in (yaml.safe_load(path.read_text()) or {})
    assert refusals_of(str(path), replay=not cluster) == []
    replays(path)


# -- generated from the node kinds' options --------------------------------------------------------
def one_at_a_time() -> list[tuple[str, dict]]:
    cases = []
    for kind, (base, options) in KINDS.items():
        for option, values in options.items():
            cases += [(kind, {**base, option: value}) for value in values]
    base = {"rulesets": CLAIM_RULESETS}
    for option, values in SORT_OPTIONS.items():
        cases += [("pair", {**base, option: value}) for value in values]
    for option, values in RULESET_OPTIONS.items():
        cases += [("pair", {"rulesets": [CLAIM_RULESETS[0], {**CLAIM_RULESETS[1], option: value}]})
                  for value in values]
    return cases


CASES = one_at_a_time()


@pytest.mark.parametrize("kind, section", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_each_node_option_means_the_same_in_replay_and_on_the_cluster(kind, section, tmp_path):
    check_agreement(kind, section, tmp_path)


def test_the_generated_options_are_both_taken_and_refused(tmp_path):
    # Not a vacuous agreement: for every kind, some files load both ways and some are refused.
    seen: dict[str, set[bool]] = {}
    for i, (kind, section) in enumerate(CASES):
        (tmp_path / str(i)).mkdir()
        seen.setdefault(kind, set()).update(check_agreement(kind, section, tmp_path / str(i)))
    assert all(v == {True, False} for v in seen.values()), seen


@st.composite
def combined(draw) -> tuple[str, dict]:
    kind = draw(st.sampled_from([*KINDS, "pair"]))
    if kind == "pair":
        node = {k: draw(st.sampled_from(v)) for k, v in SORT_OPTIONS.items() if draw(st.booleans())}
        ruleset = {**CLAIM_RULESETS[1], **{k: draw(st.sampled_from(v)) for k, v in RULESET_OPTIONS.items()
                                           if draw(st.booleans())}}
        return kind, {**node, "rulesets": [CLAIM_RULESETS[0], ruleset]}
    base, options = KINDS[kind]
    return kind, {**base, **{k: draw(st.sampled_from(v)) for k, v in options.items() if draw(st.booleans())}}


@settings(max_examples=150, deadline=None)
@given(case=combined())
def test_combined_node_options_mean_the_same_in_replay_and_on_the_cluster(case, tmp_path_factory):
    check_agreement(*case, tmp_path_factory.mktemp("flow"))


@pytest.mark.parametrize("option, value", [("id_ttl", 60), ("rollback_on", {"field": "kind", "equals": "p"})])
def test_the_replay_only_sort_options_are_refused_on_the_pair_with_why(option, value, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(flow_text("pair", {"rulesets": CLAIM_RULESETS, option: value}, cluster=True))
    assert refusal(path) == (f"nodes.sort.{option}", REPLAY_SORT_ONLY[option])
    assert refusal(path) in {(e.field, e.reason) for e in refusals_of(str(path))}
