"""A bug planted on purpose, caught honestly: the broken version fails a run, and the code as it
ships passes that same run (seed and settings).

Without the second half, a test that plants a bug proves less than its name: a run that fails
under some settings would count as "caught" even when the whole code fails it too (a real loss).
:func:`caught` undoes the plant (``monkeypatch.undo()``) and runs the failing seed again with the
same settings, which must pass. The seeds each test searches are the ones known to show its bug
(the first that does among a wider range, named in the test), so that a search costs a run or
two, not a hundred.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from twinflow.chaos.sim.simulator import run_once


def first_failure(seeds: Iterable[int], **settings):
    """The first run of ``seeds`` (``run_once(seed, **settings)``) that fails; None when all pass."""
    for seed in seeds:
        result = run_once(seed, **settings)
        if not result.passed:
            return result
    return None


def caught(monkeypatch: pytest.MonkeyPatch, seeds: Iterable[int], problems: tuple[str, ...], *,
           replays: bool = False, **settings):
    """The first failing run of ``seeds`` with the bug planted (through ``monkeypatch``), which must
    name one of ``problems`` (and, with ``replays``, fail again the same way, step for step); then,
    the plant undone, the same seed and settings must pass."""
    seeds = tuple(seeds)
    failed = first_failure(seeds, **settings)
    assert failed is not None, f"the planted bug passed every run of seeds {seeds[0]}..{seeds[-1]}"
    assert any(p in found for p in problems for found in failed.problems), failed.problems
    if replays:
        again = run_once(failed.seed, **settings)
        assert (again.problems, again.trace) == (failed.problems, failed.trace)
    monkeypatch.undo()
    control = run_once(failed.seed, **settings)
    assert control.passed, (f"seed {failed.seed} fails without the planted bug too", control.problems)
    return failed
