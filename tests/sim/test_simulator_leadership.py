"""The simulator runs the real election code (``cluster/leadership.py``) over its ZooKeeper model,
through kazoo's client interface: it holds no copy of it and touches no private name of
``twinflow.cluster``; a leadership broken on purpose is caught; rolling restarts (a graceful
stop and a start, one peer after the other) keep every promise."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.sim.planted import caught
from twinflow.chaos.sim.simulator import run_once
from twinflow.cluster.leadership import Leadership

SIM = Path(__file__).resolve().parents[2] / "chaos" / "sim"


def _private_uses(path: Path) -> list[str]:
    """Names starting with one underscore that ``path`` takes from a ``twinflow.cluster`` module:
    imported by name, or read as an attribute of a module or name imported from there."""
    tree = ast.parse(path.read_text())
    from_cluster: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and "cluster" in (node.module or "").split("."):
            for alias in node.names:
                from_cluster.add(alias.asname or alias.name)
                if alias.name.startswith("_"):
                    found.append(f"{path.name}: imports {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in from_cluster and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_the_simulator_runs_the_real_leadership_and_no_copy_of_cluster_code():
    modules = sorted(SIM.glob("*.py"))
    assert [m.name for m in modules if "from ...cluster.leadership import Leadership" in m.read_text()] == ["simulated_parts.py"]
    for m in modules:
        classes = [n.name for n in ast.walk(ast.parse(m.read_text())) if isinstance(n, ast.ClassDef)]
        assert not [c for c in classes if c.endswith("Leadership")], m.name
    assert [u for m in modules for u in _private_uses(m)] == []


def test_a_peer_is_the_real_leadership_on_the_kazoo_model():
    r = run_once(3, kind="pair")
    assert r.passed, r.problems
    assert r.promotions >= 1
    # The real class's threads ran: the election won, on the model's epoch znode.
    assert any("won the election: epoch 1" in line for line in r.trace)


def test_a_promotion_that_skips_the_epoch_znode_is_caught(monkeypatch):
    # A promotion must take its epoch by writing the epoch znode (its new version): one that takes
    # the next number after the epoch it last saw (a watch that may lag) can repeat an epoch.
    monkeypatch.setattr(Leadership, "_next_epoch", lambda self: self.current_master()[1] + 1)
    caught(monkeypatch, (1,), ("but the epoch znode is at",), kind="chained")  # the first of seeds 1-2,000


def test_a_demotion_that_ignores_a_lost_session_is_caught(monkeypatch):
    # A master whose session was lost must step down: its lock went with the session.
    real = Leadership.step_down

    def ignores_lost_sessions(self, reason):
        if reason != "session lost":
            real(self, reason)

    monkeypatch.setattr(Leadership, "step_down", ignores_lost_sessions)
    caught(monkeypatch, (7,), ("does not hold the election lock",), replays=True,  # the first of seeds 1-2,000
           kind="chained")


@pytest.mark.parametrize("kind", ["pair", "chained", "sharded"])
def test_rolling_restarts_keep_every_promise(kind):
    # Every fault a rolling restart where one can start: the worker stopped gracefully and started,
    # then the master, whose graceful stop hands the role over, with traffic all along.
    runs = [run_once(seed, kind=kind, only={"rolling": 1.0}) for seed in range(1, 13)]
    assert [(r.seed, r.problems) for r in runs if not r.passed] == []
    assert sum(r.counts["rolling_restarts"] for r in runs) >= 12
    handed = [line for r in runs for line in r.trace if "stopped gracefully (was master" in line]
    assert handed  # masters stopped gracefully, so they handed over
    assert any("demoted (handover)" in line for r in runs for line in r.trace)
