"""The drills of a guarded handler: a flow whose handler a history with external completion guards
(``examples/cluster-guarded.yaml``, its handler and resolver in ``examples/ledger_handlers.py``).

The handler books each order in a ledger folder that both peers share (see
``ledger_handlers``), taking ``DELAY_MS`` per call, so that a master killed
mid-stream is almost always inside a call. On top of the checker's promises
(nothing lost or duplicated on the outlinks), the ledger is checked
(:func:`ledger_verdict`):

- ``double_booked``: orders booked twice (a handler's effect repeated);
- ``unbooked``: orders whose handler was called but never booked, although
  the message left the flow (a call lost to a kill must have been repeated,
  through In Doubt and a New decision);
- ``repeated_calls``: calls beyond the first for an order, less the In Doubt
  messages the resolver sent to run again (``resolved.jsonl``): a handler
  called twice outside In Doubt.

A drill of this module passes only with all three at 0. The verdict also
counts the resolver's decisions: ``in_doubt_run_again`` and
``in_doubt_duplicate`` (its answers), and of those ``in_doubt_in_progress``:
second copies of an order that came while a run of it was still under way.

``resubmit-in-failover`` also refuses every ``REFUSE_EVERY``-th message in
the ledger (``refuse/<id>``): those leave by ``error`` and are audited
FAILED. While the master is killed and the worker takes over, an operator
resubmits every FAILED entry (``twinflow failures resubmit --all``). Each
must run exactly once more (:func:`resubmit_verdict`: one outcome per
resubmitted entry, none left FAILED, its order booked once), and the
checker counts a resubmitted message's first leaving by ``error`` as what
the resubmit answered, not as a second leaving (:func:`without_resubmitted`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path

from ..runtime.nodes.history import IN_PROGRESS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GUARDED_FLOW = EXAMPLES / "cluster-guarded.yaml"
HANDLERS = EXAMPLES / "ledger_handlers.py"
DELAY_MS = 10  # each handler call's own work: the kill lands inside a call
RATE = 60.0    # messages per second: what one master with that handler keeps up with, on two cores
REFUSE_EVERY = 7  # resubmit-in-failover: every 7th message fails for good until it is resubmitted


def prepare(workdir: Path, delay_ms: int = DELAY_MS) -> Path:
    """Put the handler module next to the flow file in ``workdir`` and make the ledger; the peers
    started after this (they inherit the environment) book into it. Returns the ledger folder."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(HANDLERS, workdir / HANDLERS.name)
    ledger = workdir / "ledger"
    (ledger / "booked").mkdir(parents=True, exist_ok=True)
    (ledger / "refuse").mkdir(exist_ok=True)
    os.environ["TWINFLOW_LEDGER"] = str(ledger)
    os.environ["TWINFLOW_LEDGER_DELAY_MS"] = str(delay_ms)
    return ledger


def booking_name(uuid: str) -> str:
    """The handler's file name for an order's booking (``ledger_handlers.booking_name``)."""
    return hashlib.sha256(uuid.encode("utf-8", "surrogatepass")).hexdigest()


def refuse(ledger: Path, ids: list[str]) -> None:
    """Make the ledger refuse these messages (a service error each) until :func:`accept_all`."""
    for mid in ids:
        (ledger / "refuse" / mid).touch()


def accept_all(ledger: Path) -> int:
    """The ledger takes every order again; returns how many it had refused."""
    refused = list((ledger / "refuse").iterdir())
    for path in refused:
        path.unlink()
    return len(refused)


def resubmit_verdict(r, keys) -> dict:
    """The audit after a drill that resubmitted (``r`` a Redis client, ``keys`` the flow's keys):
    entries still FAILED, resubmitted, outcomes recorded and of those how many ``done``."""
    entries = r.xrange(keys.audit)
    marks = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.audit_marks).items()}
    outcomes = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.audit_outcomes).items()}
    resubmitted = [i.decode() for i, _ in entries if marks.get(i.decode(), {}).get("status") == "RESUBMITTED"]
    return {"audited": len(entries), "resubmitted": len(resubmitted),
            "still_failed": sum(1 for i, _ in entries if i.decode() not in marks),
            "outcomes": sum(1 for i in resubmitted if i in outcomes),
            "outcomes_done": sum(1 for i in resubmitted if outcomes.get(i, {}).get("outlink") == "done")}


def resubmit_kept(verdict: dict) -> bool:
    return verdict["resubmitted"] > 0 and verdict["still_failed"] == 0 and \
        verdict["outcomes"] == verdict["outcomes_done"] == verdict["resubmitted"]


def without_resubmitted(outputs: dict, r, keys) -> dict:
    """``outputs`` without the first leaving (by ``error``) of each message that was resubmitted:
    what the checker judges, so that a message that ran once more counts as leaving once."""
    marks = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.audit_marks).items()}
    again = Counter(f[b"id"].decode() for i, f in r.xrange(keys.audit)
                    if marks.get(i.decode(), {}).get("status") == "RESUBMITTED")
    out = {}
    for name, entries in outputs.items():
        kept = []
        for e in entries:
            if name.endswith(".error") and again[e.id] > 0:
                again[e.id] -= 1
                continue
            kept.append(e)
        out[name] = kept
    return out


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ledger_verdict(ledger: Path) -> dict:
    """The ledger's counts (see the module doc)."""
    calls = Counter(c["uuid"] for c in _lines(ledger / "calls.jsonl"))
    resolved = _lines(ledger / "resolved.jsonl")
    run_again = Counter(r["uuid"] for r in resolved if r["verdict"] == "new")
    booked = {p.name for p in (ledger / "booked").iterdir()} if (ledger / "booked").exists() else set()
    double = len(_lines(ledger / "double.jsonl"))
    unbooked = sorted(u for u in calls if booking_name(u) not in booked)
    repeated = sum(max(0, n - 1 - run_again[u]) for u, n in calls.items())
    return {"calls": sum(calls.values()), "booked": len(booked), "in_doubt_run_again": sum(run_again.values()),
            "in_doubt_duplicate": sum(1 for r in resolved if r["verdict"] == "duplicate"),
            "in_doubt_in_progress": sum(1 for r in resolved if r.get("reason") == IN_PROGRESS),
            "double_booked": double, "unbooked": len(unbooked), "repeated_calls": repeated}


def resolved_ids(ledger: Path) -> set[str]:
    """The message IDs of the In Doubt messages the resolver decided."""
    return {r["id"] for r in _lines(ledger / "resolved.jsonl")}


def ledger_kept(verdict: dict) -> bool:
    return verdict["double_booked"] == 0 and verdict["unbooked"] == 0 and verdict["repeated_calls"] == 0
