"""The failover simulator catches a broken cluster (so a pass means something): each broken
version here fails within a bounded number of seeds. Seeded runs that keep the promises, and a
seed reproducing its run exactly, are in ``test_simulator_seeds.py``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.sim.planted import caught
from twinflow.cluster.promotion import Promotion
from twinflow.cluster.warm_state import WarmState
from twinflow.runtime.nodes.history import MemoryHistoryStore
from twinflow.runtime.store import scripts
from twinflow.runtime.store.flow_store import FlowStore

MESSAGES = 40


# Readers that skip what the processed mark covers also keep a fenced-off master from running
# again what its successor processed: a second defence that hides a broken first one (a COMMIT
# without its fence passed 150 runs with it). The broken versions here run with readers that
# read every entry, as all did before, and so does each one's control run; the seeded runs draw both.
SETTINGS = {"messages": MESSAGES, "only": {"skip_processed": False}}
# Each planted bug's seed: the first of seeds 1-150 that shows it (run as SETTINGS).
SEEDS = {"fence": (148,), "applied twice": (13,), "no id check": (1,), "ids kept": (1,), "no catch-up": (1,),
         "ahead": (36,), "no history": (2,), "stale copy": (2,), "log gap": (35,)}


def plant_commit(monkeypatch, part: str, instead: str, *more: tuple[str, str]) -> None:
    """COMMIT with ``part`` replaced by ``instead`` (and each further (part, instead) pair)."""
    broken = scripts.COMMIT
    for was, now in ((part, instead), *more):
        assert was in broken
        broken = broken.replace(was, now)
    monkeypatch.setitem(scripts.ALL, "commit", broken)


def test_a_commit_without_its_fence_is_caught(monkeypatch):
    plant_commit(monkeypatch, "if epoch < cur then\n  return {-1, cur}\nend", "")
    failed = caught(monkeypatch, SEEDS["fence"], ("stale write", "two writers", "left the flow"), **SETTINGS)
    assert failed.trace  # the failing seed comes with its steps


_MARKER_CHECK = "if redis.call('EXISTS', KEYS[3]) == 1 then\n  return {2}\nend"
_VERSION_CHECK = "if ARGV[6] ~= '' and tonumber(ARGV[6]) ~= version then"


def test_a_commit_applied_twice_after_a_lost_reply_is_caught(monkeypatch):
    # The step's marker and the state version each refuse a retry of a step that was applied:
    # with both gone, a retry after a lost reply applies the step again. The run replays exactly.
    plant_commit(monkeypatch, _MARKER_CHECK, "", (_VERSION_CHECK, "if false then"))
    caught(monkeypatch, SEEDS["applied twice"], ("left the flow 2 times",), replays=True, **SETTINGS)


def test_a_guessed_commit_that_does_not_check_the_id_cache_is_caught(monkeypatch):
    # The master's one-round-trip commit must refuse a message re-published with a processed ID.
    plant_commit(monkeypatch, "redis.call('SET', KEYS[i], ARGV[1], 'NX', 'EX', ARGV[2])",
                 "redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2])")
    caught(monkeypatch, SEEDS["no id check"], ("left the flow 2 times",), **SETTINGS)


def test_a_refused_commit_that_keeps_the_ids_it_set_is_caught(monkeypatch):
    # COMMIT sets each ID only if absent and refuses the step at the first one present: the
    # IDs it set before that one must be taken back, or their messages count as processed.
    plant_commit(monkeypatch, "redis.call('DEL', KEYS[j])", "")
    caught(monkeypatch, SEEDS["ids kept"], ("never left the flow",), **SETTINGS)


def test_a_promotion_that_skips_the_catch_up_is_caught(monkeypatch):
    monkeypatch.setattr(Promotion, "catch_up", lambda self, epoch: 0)
    caught(monkeypatch, SEEDS["no catch-up"], ("never left the flow",), **SETTINGS)


def test_a_master_that_runs_a_batch_ahead_without_recording_it_is_caught(monkeypatch):
    # Spark (the simulated checkpoint) commits a batch that runs ahead: only handled_id, recorded
    # first, lets a promoted incarnation deliver what a killed or stopped one had not run.
    monkeypatch.setattr(FlowStore, "record_handled", lambda self, position, deadline_s=None, **wait: None)
    failed = caught(monkeypatch, SEEDS["ahead"], ("never left the flow",), **SETTINGS)
    assert any("with a batch running ahead of its checkpoint" in line for line in failed.trace)


def test_a_new_master_that_forgets_the_history_is_caught(monkeypatch):
    # Every master (a promoted one, or one that reloads after a refused commit) loads the
    # history from Redis; one that loads none takes a document sent again under a new ID as
    # new. Only the re-sends (Dims.resend) show it: the producer's own traffic re-sends a
    # document in the message right after the first, which one master nearly always runs.
    monkeypatch.setattr(MemoryHistoryStore, "load", lambda self, entries: None)
    caught(monkeypatch, SEEDS["no history"],
           ("re-sent a document first published", "promoted on a warm copy"), **SETTINGS)


def test_a_warm_copy_handed_over_without_the_steps_since_its_last_round_is_caught(monkeypatch):
    # A promotion must apply the change log's tail, the steps committed since the worker's
    # last round; one that takes its copy as it stands hands the new master an old history.
    real = WarmState._apply

    def stale(self, read, to_version):
        if to_version is None:
            return real(self, read, to_version)
        self._version = to_version  # the tail never applied

    monkeypatch.setattr(WarmState, "_apply", stale)
    caught(monkeypatch, SEEDS["stale copy"],
           ("promoted on a warm copy that is not the state in Redis", "re-sent a document first published"),
           **SETTINGS)


def test_a_warm_copy_that_applies_across_a_gap_in_the_log_is_caught(monkeypatch):
    # A worker that fell behind the log's length (Dims.log_trim) must read the state whole
    # again; one that applies what is left after the gap misses the steps trimmed away.
    def across_gaps(self, read, to_version):
        for entry in read.tail:
            for name, changes in entry.changes.items():
                self._nodes[name].apply_state(changes)
            self._version, self._anchor = entry.version, entry
        if to_version is not None:
            self._version = to_version

    monkeypatch.setattr(WarmState, "_apply", across_gaps)
    caught(monkeypatch, SEEDS["log gap"], ("promoted on a warm copy that is not the state in Redis",), **SETTINGS)


@pytest.mark.parametrize("args", [["--runs", "30", "--jobs", "2"]])
def test_the_cli_prints_totals_as_json(args):
    proc = subprocess.run([sys.executable, "-m", "twinflow.cli", "simulate", "--json", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["runs"] == 30 and out["failed"] == 0 and out["failed_seeds"] == []
    assert out["sent"] == 30 * MESSAGES + out["counts"].get("resent", 0) and out["promotions"] > 0
