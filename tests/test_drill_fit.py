"""Which drills apply to a flow (chaos/drill_fit.py) and what ``twinflow drill`` does with the others:
over the example flows and a few of their own, every drill either applies or says why not; ``drill
all --flow F`` runs only those that apply, says the others with their reasons (text and JSON, the
report and the results table too) and exits by what ran; a flow to which nothing applies exits 2
at once. The drills themselves are stood in for here (tests/cluster/test_drills.py runs real ones);
the last tests run the real command where it starts nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from twinflow.chaos import drill_faults, drill_fit, drills
from twinflow.chaos.drill_fit import books_in_ledger, guarded_actions, not_applicable
from twinflow.chaos.guarded_drills import GUARDED_FLOW
from twinflow.chaos.results import table
from twinflow.cli import build_parser
from twinflow.runtime.flowgraph import load_graph
from twinflow.testing.messages import CHAINED

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
DRILLS = list(drill_faults.DRILLS)
ESCALATION = {"escalation-cut", "escalation-latency"}


def fit(path: Path) -> dict[str, str | None]:
    graph = load_graph(path)
    return {name: not_applicable(name, graph) for name in DRILLS}


def test_the_sets_name_real_drills_and_the_cli_uses_the_same_guarded_set():
    assert drill_fit.GUARDED <= set(DRILLS) and drill_fit.NEEDS_PAIR <= set(DRILLS)
    assert drill_faults.GUARDED is drill_fit.GUARDED


def test_every_drill_applies_to_the_flow_it_runs_without_flow():
    chained, guarded = load_graph(CHAINED), load_graph(GUARDED_FLOW)
    for name in DRILLS:
        assert not_applicable(name, guarded if name in drill_faults.GUARDED else chained) is None, name


@pytest.mark.parametrize("example", ["cluster.yaml", "cluster-chained.yaml", "cluster-every-node.yaml",
                                     "cluster-claim-rulesets.yaml"])
def test_an_example_without_a_guarded_handler_leaves_out_the_guarded_drills_alone(example):
    got = fit(EXAMPLES / example)
    assert {name for name, why in got.items() if why} == set(drill_faults.GUARDED)
    assert got["kill-in-handler"].startswith("no action's handler is guarded by a history node with "
                                             "completion: external")


def test_the_guarded_example_takes_every_drill_and_books_in_the_ledger():
    assert fit(EXAMPLES / "cluster-guarded.yaml") == dict.fromkeys(DRILLS)
    graph = load_graph(EXAMPLES / "cluster-guarded.yaml")
    assert guarded_actions(graph) == ["book"] and books_in_ledger(graph)
    assert not books_in_ledger(load_graph(EXAMPLES / "cluster.yaml"))


def test_the_sharded_example_takes_no_local_drill():
    got = fit(EXAMPLES / "cluster-sharded.yaml")
    assert all(why and why.startswith("the flow is sharded (uplink.shards: 2)") for why in got.values())
    assert "spark-worker-crash --hosts" in got["kill-master"]


def test_a_flow_without_a_claim_pair_leaves_out_the_escalation_drills(tmp_path):
    flow = tmp_path / "flow.yaml"
    flow.write_text("flow: f\nuplink: {stream: uplink}\nmessage: {id: id}\nnodes:\n"
                    "  deliver: {type: action, sink: {stream: sink}}\n")
    got = fit(flow)
    assert {name for name, why in got.items() if why} == ESCALATION | set(drill_faults.GUARDED)
    assert got["escalation-cut"] == "the flow has no claim pair (a sort node with pairs_with): its master sends no escalations"


def test_a_guarded_handler_of_its_own_is_named_and_left_out(tmp_path):
    """A history with external completion guards the action two links on (through a join); the
    handler is the flow's own, which the guarded drills cannot watch. A handler-less action after
    such a history is no guarded handler."""
    (tmp_path / "shop_handlers.py").write_text("def ship(msg):\n    return None\n")
    flow = tmp_path / "flow.yaml"
    flow.write_text("""\
flow: shop
uplink: {stream: uplink}
message: {id: id}
nodes:
  guard: {type: history, uuid: uuid, completion: external, links: {new: match}}
  match: {type: join, types: [order, payment], activation_field: order_id, timeout: 5, links: {joined: ship}}
  ship: {type: action, handler: "shop_handlers:ship", sink: {stream: sink}}
  claims: {type: sort, pairs_with: ship, key: seq}
""")
    graph = load_graph(flow)
    assert guarded_actions(graph) == ["ship"] and not books_in_ledger(graph)
    assert not_applicable("kill-in-handler", graph) == (
        "the guarded handler of ship (shop_handlers.ship) is not examples/ledger_handlers.py's book: the drill "
        "sees a call under way, and counts the bookings, only in that ledger")
    assert not_applicable("kill-master", graph) is None
    flow.write_text(flow.read_text().replace('handler: "shop_handlers:ship", ', ""))
    assert guarded_actions(load_graph(flow)) == []


# -- twinflow drill, its drills stood in for -----------------------------------------------------
@pytest.fixture
def stand_ins(monkeypatch):
    """run_drill replaced by one that records each call and fails the drills named in ``failing``;
    as if in the drills' own network namespace (no unshare)."""
    calls, failing = [], set()

    def run_drill(name, seed=1, messages=10_000, **kw):
        calls.append((name, kw.get("rate"), kw.get("books_in_ledger")))
        return {"drill": name, "seed": seed, "messages": messages, "lost": 0, "duplicated": 0,
                "out_of_order": 0, "stale_writes": 0, "rto_s": 1.0, "passed": name not in failing,
                "rerun": f"twinflow drill {name}"}

    monkeypatch.setattr(drills, "run_drill", run_drill)
    monkeypatch.setattr("twinflow.chaos.kernel_faults.in_private_netns", lambda: True)
    # The command puts the flow's folder on the peers' PYTHONPATH: put it back as it was after the test.
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return calls, failing


def drill(*argv: str) -> int:
    args = build_parser().parse_args(["drill", *argv])
    args.argv = ["drill", *argv]
    return args.fn(args)


def test_drill_all_on_a_flow_without_a_guarded_handler_runs_the_rest_and_exits_by_them(stand_ins, tmp_path, capsys):
    calls, failing = stand_ins
    flow = str(EXAMPLES / "cluster.yaml")
    assert drill("all", "--flow", flow, "--json", "--report", str(tmp_path / "r")) == 0
    ran = [name for name, _, _ in calls]
    assert ran == [n for n in DRILLS if n not in drill_faults.GUARDED]
    assert all(rate == 1000.0 and ledger is False for _, rate, ledger in calls)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    skipped = {line["drill"]: line["not_applicable"] for line in lines if "not_applicable" in line}
    assert set(skipped) == set(drill_faults.GUARDED) and lines[:2] == [{"drill": n, "not_applicable": skipped[n]}
                                                                        for n in skipped]
    assert [line["drill"] for line in lines if "passed" in line] == ran
    report = (tmp_path / "r" / "report.md").read_text()
    assert f"- kill-in-handler: not applicable: {skipped['kill-in-handler']}" in report
    # The results table of these lines lists them under it, and counts only what ran.
    summary = table(lines)
    assert "| kill-in-handler |" not in summary and summary.endswith(
        f"- resubmit-in-failover: not applicable: {skipped['resubmit-in-failover']}")

    # A drill that ran and failed sets the status; one that did not apply never does.
    calls.clear()
    failing.add("kill-master")
    assert drill("all", "--flow", flow, "--report", str(tmp_path / "r2")) == 1
    out = capsys.readouterr()
    assert f"kill-in-handler: not applicable: {skipped['kill-in-handler']}" in out.out.splitlines()
    assert f"drill kill-in-handler: not applicable: {skipped['kill-in-handler']}" in out.err


def test_drill_all_on_the_guarded_flow_runs_every_drill_with_the_ledger(stand_ins, tmp_path):
    calls, _ = stand_ins
    assert drill("all", "--flow", str(EXAMPLES / "cluster-guarded.yaml"), "--json", "--report", str(tmp_path)) == 0
    assert [name for name, _, _ in calls] == DRILLS
    # Its handler books into the ledger whatever the drill: each gets one, at the guarded flow's rate.
    assert {(rate, ledger) for _, rate, ledger in calls} == {(60.0, True)}
    # And the peers import handlers from the flow's folder, as `twinflow run` of the file would.
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(EXAMPLES)


def test_without_flow_every_drill_runs_as_before(stand_ins, tmp_path):
    calls, _ = stand_ins
    assert drill("all", "--json", "--report", str(tmp_path)) == 0
    assert [name for name, _, _ in calls] == DRILLS


# -- the real command, where it starts nothing ----------------------------------------------------
def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twinflow.cli", "drill", *argv], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_a_drill_that_does_not_apply_is_refused_with_its_reason_before_anything_starts():
    r = run_cli("kill-in-handler", "--flow", "examples/cluster.yaml")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("kill-in-handler: not applicable: no action's handler is guarded")
    assert "twinflow: drill kill-in-handler does not apply to examples/cluster.yaml" in r.stderr


def test_drill_all_on_a_sharded_flow_lists_every_drill_and_exits_2():
    r = run_cli("all", "--flow", "examples/cluster-sharded.yaml", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [line["drill"] for line in lines] == DRILLS
    assert all(line["not_applicable"].startswith("the flow is sharded") for line in lines)
    assert "twinflow: no drill applies to examples/cluster-sharded.yaml" in r.stderr
