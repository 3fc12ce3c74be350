"""The cluster's promises, checked against what left the flow: the one checker the tests, the
demo, the drills, the benches and the failover simulator use.

What leaves a flow is read from its output streams as :class:`SinkEntry` rows
(:func:`read_outputs`; a group's entry names its members' IDs joined by ``+``). A
:class:`Tally` counts them in the order they are read and judges each as it comes:

- ``duplicated``: leavings of a message beyond its first (through any outlink);
- ``stale_writes``: entries written at an epoch older than one that already wrote
  (one writer per epoch, a fenced master writes nothing more);
- ``two_writers``: entries of an epoch that another peer already wrote at.

Against the IDs that were sent, :meth:`Tally.report` adds ``lost`` (sent, never left)
and ``unexpected`` (left, never sent). :func:`check` reads a whole run at once (entries
in Redis time order) and adds ``out_of_order`` (resequence outputs out of sequence
within their group, :func:`count_out_of_order`) and ``rto_s`` (for each fault, from the
fault itself to the first write after it, :func:`recovery_after_fault_s`; the largest, and
none when nothing was written after one of the faults).

A run is judged once its outputs have gone quiet (:func:`wait_judged`: every sent ID left,
then nothing new for :data:`SETTLE_S`), not the moment the last ID arrives: a second copy
still on its way would otherwise never be looked for.

The failover simulator feeds its :class:`Tally` step by step and layers its own rules
on top (an ID that expired from the ID cache may leave again; hostile messages leave by
the failure path): see ``chaos/sim/checker.py``.

>>> t = Tally()
>>> t.add(SinkEntry("m1", 1, "a", 10)), t.add(SinkEntry("m2+m1", 2, "b", 20)), t.add(SinkEntry("m3", 1, "a", 30))
(([], []), (['m1'], []), ([], ['stale write: a wrote m3 at epoch 1 after epoch 2 had written']))
>>> r = t.report(["m1", "m2", "m4"])
>>> (r.lost, r.duplicated, r.unexpected, r.stale_writes, r.lost_ids)
(1, 1, 1, 1, ['m4'])
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..runtime.waiting import wait_for, wait_settled

# How long a flow's outputs must stay unchanged before exactly-once is judged: longer than a
# master's batch and a worker's claim round (about a second), so that a second copy already on
# its way (a promoted worker's rollback, a retried step) lands before the count.
SETTLE_S = 1.5


@dataclass(frozen=True)
class SinkEntry:
    id: str
    epoch: int
    peer: str                         # the peer that wrote it (the entry's "node" field)
    written_ms: int
    at: float | None = None  # the flow's time of the decision (a time-out's due time)


@dataclass
class SinkReport:
    sent: int
    delivered: int                    # distinct sent IDs that left the flow
    lost: int
    duplicated: int                   # leavings beyond the first per ID
    unexpected: int                   # IDs that left but were never sent
    lost_ids: list[str] = field(default_factory=list)
    duplicated_ids: list[str] = field(default_factory=list)
    unexpected_ids: list[str] = field(default_factory=list)
    stale_writes: int = 0             # entries of an epoch older than one that had written
    two_writers: int = 0              # entries of an epoch another peer had written at
    out_of_order: int = 0             # resequence outputs out of sequence (check() only)
    rto_s: float | None = None        # the longest recovery after a fault, from the fault (check() only)

    @property
    def exactly_once(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    @property
    def promises_kept(self) -> bool:
        """Exactly once, one writer per epoch, nothing stale, nothing out of order."""
        return self.exactly_once and self.stale_writes == 0 and self.two_writers == 0 and self.out_of_order == 0


class Tally:
    """The counting core: every leaving of a message and every writer of an epoch, in the order
    :meth:`add` is given them."""

    def __init__(self) -> None:
        self.left: Counter = Counter()     # message ID -> times it left
        self.writer: dict[int, str] = {}   # epoch -> the first peer that wrote at it
        self.newest = 0                    # the newest epoch that wrote
        self.stale = 0
        self.split = 0

    def count(self, entry: SinkEntry) -> list[str]:
        """Count the entry's members as left; returns those that had left before."""
        again = []
        for member in entry.id.split("+"):
            self.left[member] += 1
            if self.left[member] > 1:
                again.append(member)
        return again

    def judge_writer(self, entry: SinkEntry) -> list[str]:
        """One writer per epoch and nothing stale: the problems this entry shows (and counts)."""
        problems = []
        first = self.writer.setdefault(entry.epoch, entry.peer)
        if first != entry.peer:
            self.split += 1
            problems.append(f"two writers at epoch {entry.epoch}: {first} and {entry.peer}")
        if entry.epoch < self.newest:
            self.stale += 1
            problems.append(f"stale write: {entry.peer} wrote {entry.id} at epoch {entry.epoch} after epoch "
                            f"{self.newest} had written")
        self.newest = max(self.newest, entry.epoch)
        return problems

    def add(self, entry: SinkEntry) -> tuple[list[str], list[str]]:
        """:meth:`count` and :meth:`judge_writer`: (members seen again, writer problems)."""
        return self.count(entry), self.judge_writer(entry)

    def report(self, sent_ids: Iterable[str], allowed: Counter | None = None,
               may_leave: Iterable[str] = ()) -> SinkReport:
        """Lost, duplicated and unexpected against ``sent_ids``. ``allowed``: leavings beyond the
        first that are no duplicates (per ID); ``may_leave``: IDs that may leave though not sent."""
        allowed = allowed or Counter()
        sent = set(sent_ids)
        lost = sorted(sent - self.left.keys())
        dups = sorted(m for m, c in self.left.items() if c - 1 - allowed[m] > 0)
        unexpected = sorted(self.left.keys() - sent - set(may_leave))
        return SinkReport(
            sent=len(sent),
            delivered=len(sent & self.left.keys()),
            lost=len(lost),
            duplicated=sum(c - 1 - allowed[m] for m, c in self.left.items() if c > 1),
            unexpected=len(unexpected),
            lost_ids=lost[:20],
            duplicated_ids=dups[:20],
            unexpected_ids=unexpected[:20],
            stale_writes=self.stale,
            two_writers=self.split,
        )


# -- reading ------------------------------------------------------------------------------------
def read_sink(client, sink_key: str, page: int = 10_000) -> list[SinkEntry]:
    """Every entry of the sink stream, oldest first."""
    return [e for _, e in read_sink_after(client, sink_key, "0-0", page)]


def read_sink_after(client, stream: str, after: str, page: int = 10_000) -> list[tuple[str, SinkEntry]]:
    """(position, SinkEntry) for each entry of ``stream`` after position ``after``, oldest first."""
    out: list[tuple[str, SinkEntry]] = []
    start = "(" + after
    while True:
        batch = client.xrange(stream, min=start, max="+", count=page)
        for entry_id, fields in batch:
            eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            out.append((eid, sink_entry(eid, fields)))
        if len(batch) < page:
            return out
        start = "(" + out[-1][0]


def sink_entry(entry_id, fields: dict) -> SinkEntry:
    """One output stream entry (as redis-py returns it) as a SinkEntry."""
    eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    f = {k.decode(): v.decode() for k, v in fields.items() if k != b"data"}
    at = float(f["at"]) if "at" in f else None
    return SinkEntry(f["id"], int(f["epoch"]), f["node"], int(eid.split("-")[0]), at)


def read_outputs(client, streams: dict[tuple[str, str], str]) -> dict[str, list[SinkEntry]]:
    """Every entry of each output stream (see ``cluster.master_flow.outlink_streams``), as
    ``"node.outlink"`` -> entries; a group's entry has its members' IDs joined by ``+``."""
    return {f"{node}.{outlink}": read_sink(client, key) for (node, outlink), key in streams.items()}


def read_sequences(client, graph, keys) -> dict[str, list[tuple[object, object]]]:
    """(group, seq) of every output of each resequence node, in stream order."""
    out = {}
    for name, node in graph.nodes.items():
        if node.kind != "resequence":
            continue
        rows = []
        for _, fields in client.xrange(keys.out(name, "out")):
            info = json.loads(fields.get(b"info", b"{}"))
            rows.append((info.get("group"), info.get("seq")))
        out[name] = rows
    return out


# -- judging ------------------------------------------------------------------------------------
def in_time_order(outputs: dict[str, list[SinkEntry]]) -> list[SinkEntry]:
    """Every entry of every outlink, by the Redis time it was written."""
    return sorted((e for entries in outputs.values() for e in entries), key=lambda e: e.written_ms)


def check_outputs(outputs: dict[str, list[SinkEntry]], sent_ids: list[str]) -> SinkReport:
    """Every sent message out of the flow exactly once, through one outlink (alone or in a group);
    one writer per epoch and nothing stale, over the entries in Redis time order."""
    tally = Tally()
    for e in in_time_order(outputs):
        tally.add(e)
    return tally.report(sent_ids)


def check_sink(entries: list[SinkEntry], sent_ids: list[str]) -> SinkReport:
    """:func:`check_outputs` over one stream."""
    return check_outputs({"sink": entries}, sent_ids)


def check(outputs: dict[str, list[SinkEntry]], sent_ids: list[str], faults: Iterable[float] = (),
          sequences: dict[str, list[tuple[object, object]]] | None = None) -> SinkReport:
    """Every promise over a whole run: :func:`check_outputs`, resequence outputs in order
    (``sequences``, from :func:`read_sequences`) and the longest recovery after ``faults``
    (epoch seconds each began, as the drill that injected it recorded):
    :func:`recovery_after_fault_s` of each. When nothing was written after one of them,
    ``rto_s`` is None: that fault was never recovered from (a drill that kills the master
    then fails)."""
    report = check_outputs(outputs, sent_ids)
    report.out_of_order = sum(count_out_of_order(rows) for rows in (sequences or {}).values())
    writes = in_time_order(outputs)
    gaps = [recovery_after_fault_s(writes, at) for at in faults]
    if gaps and None not in gaps:
        report.rto_s = max(gaps)
    return report


def merge_outputs(shard_outputs: list[dict]) -> dict:
    """Every shard's outputs as one ("node.outlink" -> entries of every shard)."""
    out: dict = {}
    for shard in shard_outputs:
        for name, entries in shard.items():
            out.setdefault(name, []).extend(entries)
    return out


def check_shards(shard_outputs: list[dict], sent_ids: list[str], faults: Iterable[float] = (),
                 sequences: dict | None = None) -> SinkReport:
    """:func:`check` over what left every shard of a flow; one writer per epoch and nothing stale
    are judged shard by shard, each shard having epochs of its own."""
    report = check(merge_outputs(shard_outputs), sent_ids, faults, sequences=sequences)
    if len(shard_outputs) > 1:
        tallies = [Tally() for _ in shard_outputs]
        for tally, outputs in zip(tallies, shard_outputs):
            for entry in in_time_order(outputs):
                tally.judge_writer(entry)
        report.stale_writes = sum(t.stale for t in tallies)
        report.two_writers = sum(t.split for t in tallies)
    return report


def count_out_of_order(rows: Iterable[tuple[object, object]]) -> int:
    """Outputs whose sequence number is not above the one before in their group.

    >>> count_out_of_order([("g", 1), ("h", 1), ("g", 3), ("g", 2), ("h", 2)])
    1
    """
    bad, last = 0, {}
    for group, seq in rows:
        if group in last and seq <= last[group]:
            bad += 1
        last[group] = seq
    return bad


def recovery_after_fault_s(writes: list[SinkEntry], at: float) -> float | None:
    """The recovery time of a fault at ``at`` (epoch s, when the drill injected it): seconds
    from ``at`` to the first write after it, or, when a newer epoch wrote after the fault, to
    that epoch's first write (a dying master's commit in flight as the fault began is not a
    recovery). Newer than the epoch of the last write before the fault; with no write before
    it (a master too slow to have written yet), newer than the lowest epoch written after it
    (the one that may be the dying master's), so the measure errs long, never short. None
    when nothing was written after the fault. ``writes``: in time order.

    >>> ms = 1_800_000_000_000
    >>> late = [SinkEntry("m1", 1, "a", ms + 1_200), SinkEntry("m2", 2, "b", ms + 2_000)]
    >>> recovery_after_fault_s(late, 1_800_000_000.5)   # nothing before; a's COMMIT in flight landed
    1.5
    """
    after = [w for w in writes if w.written_ms / 1000 > at]
    if not after:
        return None
    before = [w for w in writes if w.written_ms / 1000 <= at]
    epoch = before[-1].epoch if before else min(w.epoch for w in after)
    first = next((w for w in after if w.epoch > epoch), after[0])
    return first.written_ms / 1000 - at


def recovery_s(writes: list[SinkEntry], at: float) -> float | None:
    """The gap the writes show around a fault at ``at`` (epoch s): seconds from the last write
    before it to the first write after it; when a newer epoch wrote after the fault, to that
    epoch's first write. None without a write on each side. ``rto_s`` does not use it (a
    master that wrote nothing before the fault leaves no gap to measure:
    :func:`recovery_after_fault_s`); the drills between hosts report it per fault
    (``rto_each_s``). ``writes``: in time order."""
    before = [w for w in writes if w.written_ms / 1000 <= at]
    after = [w for w in writes if w.written_ms / 1000 > at]
    if not before or not after:
        return None
    newer = [w for w in after if w.epoch > before[-1].epoch]
    first = (newer or after)[0]
    return (first.written_ms - before[-1].written_ms) / 1000


def failover_seconds(entries: list[SinkEntry], old_epoch: int, killed_at: float) -> float | None:
    """Seconds from ``killed_at`` (epoch s) to the first sink write of a newer epoch."""
    for e in entries:
        if e.epoch > old_epoch:
            return e.written_ms / 1000.0 - killed_at
    return None


def wait_judged(outputs: Callable[[], dict[str, list[SinkEntry]]], sent_ids: list[str], timeout_s: float,
                quiet_s: float = SETTLE_S, interval_s: float = 0.5) -> dict[str, list[SinkEntry]]:
    """``outputs()`` once every ID of ``sent_ids`` has left the flow and nothing new has come for
    ``quiet_s``: what to judge. At ``timeout_s`` (each wait's own), what there is then: the
    judge counts what is missing or still arriving."""
    wait_for(lambda: check_outputs(outputs(), sent_ids).delivered >= len(sent_ids), timeout_s, interval_s)
    return wait_settled(outputs, quiet_s, max(timeout_s, quiet_s), interval_s) or outputs()
