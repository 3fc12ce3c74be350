"""The failover timeline: each promotion, phase by phase, from the flow's events stream.

A promoted peer records its promotion (event ``promoted``) with the time of each phase it
went through, and its term's first committed step (event ``first_write``) on its own: the
console joins the two by epoch. The phases, in order:

- ``master_lost``: the old master's last sign of life (its last status or batch);
- ``session_expired``: the election gave this peer the lock (the old master's ZooKeeper
  session ended, or it handed over);
- ``promoted``: the new epoch fenced in Redis;
- ``state_loaded``: the old master's committed state taken over;
- ``rolled_back``: what the old master had not delivered delivered (``rolled_back`` messages);
- ``first_write``: the new master's first committed step.

Each phase shows its time and how long it took after the one before it. A phase the record
does not have (an old peer's record, a handover with no master lost) is shown without a time;
nothing is guessed.

>>> records = [
...     {"event": "first_write", "peer": "b", "epoch": 4, "at": 107.0},
...     {"event": "promoted", "peer": "b", "epoch": 4, "at": 106.5, "master_lost_at": 100.0,
...      "session_expired_at": 102.0, "promoted_at": 102.1, "state_loaded_at": 102.3,
...      "rolled_back_at": 106.5, "rolled_back": 12, "old_master": "a"},
... ]
>>> [f["phases"] for f in failovers(records)][0][1:3]
[{'phase': 'session_expired', 'at': 102.0, 's': 2.0}, {'phase': 'promoted', 'at': 102.1, 's': 0.1}]
>>> failovers(records)[0]["total_s"], failovers(records)[0]["rolled_back"], failovers(records)[0]["cause"]
(7.0, 12, 'failover')
"""

from __future__ import annotations

PHASES = ("master_lost", "session_expired", "promoted", "state_loaded", "rolled_back", "first_write")


def failovers(records: list[dict], limit: int = 10) -> list[dict]:
    """The last ``limit`` promotions in ``records`` (the events stream, newest first), newest first:
    ``{"epoch", "peer", "at", "cause", "old_master", "rolled_back", "warm_state",
    "phases": [{"phase", "at", "s"}], "total_s"}``; ``cause`` is ``handover`` when the old master
    recorded handing its role to this peer, ``failover`` when another master was before it,
    ``start`` when none was (the flow's first master, or one after every peer had stopped)."""
    first_writes = {r.get("epoch"): r for r in records if r.get("event") == "first_write"}
    # A handover the old master was asked for, and that went to this peer: its term was epoch - 1.
    handed = {(r.get("epoch"), r.get("new_master")) for r in records if r.get("event") == "handover" and r.get("ok")}
    out = []
    for record in records:
        if record.get("event") != "promoted":
            continue
        epoch = record.get("epoch")
        first = first_writes.get(epoch)
        times = {phase: _number(record.get(f"{phase}_at")) for phase in PHASES}
        if first is not None:
            times["first_write"] = _number(first.get("first_write_at", first.get("at")))
        phases, before = [], None
        for phase in PHASES:
            at = times[phase]
            took = None if at is None or before is None else round(max(0.0, at - before), 3)
            phases.append({"phase": phase, "at": at, "s": took})
            before = at if at is not None else before
        known = [t for t in times.values() if t is not None]
        handover = isinstance(epoch, int) and (epoch - 1, record.get("peer")) in handed
        out.append({
            "epoch": epoch, "peer": record.get("peer"), "at": _number(record.get("at")),
            "cause": "handover" if handover else "failover" if record.get("old_master") else "start",
            "old_master": record.get("old_master"),
            "rolled_back": record.get("rolled_back", 0), "warm_state": record.get("warm_state"),
            "phases": phases,
            "total_s": round(max(known) - min(known), 3) if len(known) > 1 else None,
        })
        if len(out) == limit:
            break
    return out


def _number(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
