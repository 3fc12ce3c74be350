"""The handler and resolver of examples/cluster-guarded.yaml: an order ledger that books each order once.

The ledger is a folder (``TWINFLOW_LEDGER``, default ``./ledger``) that every
peer of the flow reaches (on one machine, or a shared mount):

- ``calls.jsonl``: one line per handler call, written as the call begins;
- ``booked/<sha-256 of the uuid>``: made once, when an order is booked (a
  second booking of the same order is a line in ``double.jsonl``);
- ``resolved.jsonl``: one line per In Doubt message the resolver decided,
  with why it was In Doubt (``reason``);
- ``down`` (a file an operator makes): every call fails with a transient
  error, so the action retries and then suspends the flow;
- ``refuse/<id>`` (files an operator makes): the call for that message fails
  with a service error, so it leaves by ``error`` and is audited FAILED.

``TWINFLOW_LEDGER_DELAY_MS`` makes each call take that long before it books
(a slow downstream system: the failover drill kills the master inside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from twinflow.runtime.nodes.action import TransientError
from twinflow.runtime.nodes.history import DUPLICATE, IN_PROGRESS, NEW


def ledger() -> Path:
    return Path(os.environ.get("TWINFLOW_LEDGER", "ledger"))


def _note(name: str, record: dict) -> None:
    # One write per line with O_APPEND: lines from several processes never interleave.
    with open(ledger() / name, "a") as f:
        f.write(json.dumps(record) + "\n")


def booking_name(uuid: str) -> str:
    """The file name of an order's booking: any UUID text makes a short, safe name."""
    return hashlib.sha256(uuid.encode("utf-8", "surrogatepass")).hexdigest()


def _booking(uuid: str) -> Path:
    return ledger() / "booked" / booking_name(uuid)


def book(msg, attempt):
    """Book the order ``msg`` carries; raises TransientError while the ledger is down."""
    root = ledger()
    if (root / "down").exists():
        raise TransientError("the ledger is down")
    if (root / "refuse" / str(msg.id)).exists():
        raise ValueError(f"the ledger refuses order {msg.id}")
    uuid = str(msg.doc.get("uuid") or msg.id)
    _note("calls.jsonl", {"uuid": uuid, "id": msg.id, "attempt": attempt, "pid": os.getpid()})
    delay = float(os.environ.get("TWINFLOW_LEDGER_DELAY_MS", "0")) / 1000
    if delay:
        time.sleep(delay)  # the downstream system's own work
    (root / "booked").mkdir(exist_ok=True)
    try:
        with open(_booking(uuid), "x"):
            pass
    except FileExistsError:
        _note("double.jsonl", {"uuid": uuid, "id": msg.id})


def resolve(msg, doubt):
    """An In Doubt message: Duplicate if the ledger booked its order, or if a run of it is still
    in progress (that run books it: running it again would book it twice); else New (it runs again)."""
    verdict = DUPLICATE if doubt.reason == IN_PROGRESS or _booking(doubt.uuid).exists() else NEW
    _note("resolved.jsonl", {"uuid": doubt.uuid, "id": msg.id, "verdict": verdict, "reason": doubt.reason})
    return verdict
