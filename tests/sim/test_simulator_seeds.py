"""The failover simulator: seeded runs of the real node code keep the promises, and a seed
reproduces its run exactly, also under another hash seed. (Broken clusters it catches:
``test_simulator.py``; the two files are apart so that test workers can run them at once.)"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.sim.test_simulator import MESSAGES
from twinflow.chaos.sim.simulator import run_once, simulate

SEEDED_RUNS = 150  # the 10,000-run series per kind are run by hand (docs: Performance)


def test_seeded_runs_keep_every_promise():
    out = simulate(seed=1, runs=SEEDED_RUNS, messages=MESSAGES, jobs=2)
    assert out["failures"] == [], [r.problems for r in out["failures"]]
    assert out["runs"] == SEEDED_RUNS
    assert out["sent"] == SEEDED_RUNS * MESSAGES + out["counts"].get("resent", 0)  # the re-sends too
    assert out["lost"] == 0 and out["duplicated"] == 0
    # The runs did fail over, under faults: more than one promotion per run on average.
    assert out["promotions"] > SEEDED_RUNS
    assert out["faults"] >= SEEDED_RUNS * 3
    # Some kills landed after the checkpoint took a master's batch and before it ran.
    assert out["killed_ahead"] > 0


def test_a_seed_reproduces_its_run_step_by_step():
    first, again, other = run_once(11), run_once(11), run_once(12)
    assert first.passed and again.passed
    assert first.trace == again.trace
    assert len(first.trace) > 200  # every step is in it (and the start, faults, roles)
    assert first.trace != other.trace


def test_the_same_seed_gives_the_same_trace_under_another_hash_seed(tmp_path):
    traces = []
    for hash_seed in ("1", "2"):
        proc = subprocess.run([sys.executable, "-m", "twinflow.cli", "simulate", "--runs", "1", "--seed", "5",
                               "--trace", "--json"], capture_output=True, text=True, timeout=120,
                              env={"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["passed"] is True
        traces.append(proc.stderr)
    assert traces[0] == traces[1] and "step 199:" in traces[0]
