"""The cluster's promises, checked against what reached the sink and every other outlink.

``check_sink`` reads the whole sink stream and compares it with the IDs that
were sent: every sent ID delivered exactly once (no loss, no double feed),
nothing delivered that was never sent. ``check_outputs`` does the same over
every outlink through which messages leave a flow (a group counts for each
of its members): every sent message leaves exactly once, through one outlink. ``failover_seconds`` measures from a
kill to the first sink write of a newer epoch, using the sink entries' own
Redis timestamps (the entry ID's milliseconds).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SinkReport:
    sent: int
    delivered: int                    # distinct sent IDs found in the sink
    lost: int
    duplicated: int                   # sink entries beyond the first per ID
    unexpected: int                   # sink IDs that were never sent
    lost_ids: list[str] = field(default_factory=list)
    duplicated_ids: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0


@dataclass(frozen=True)
class SinkEntry:
    id: str
    epoch: int
    node: str
    written_ms: int
    at: float | None = None  # the flow's time of the decision (a time-out's due time)


def read_sink(client, sink_key: str, page: int = 10_000) -> list[SinkEntry]:
    """Every entry of the sink stream, oldest first."""
    out: list[SinkEntry] = []
    start = "-"
    while True:
        batch = client.xrange(sink_key, min=start, max="+", count=page)
        if not batch:
            return out
        out.extend(sink_entry(entry_id, fields) for entry_id, fields in batch)
        last = batch[-1][0]
        last = last.decode() if isinstance(last, bytes) else last
        start = "(" + last
        if len(batch) < page:
            return out


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


def check_outputs(outputs: dict[str, list[SinkEntry]], sent_ids: list[str]) -> SinkReport:
    """Every sent message out of the flow exactly once, through one outlink (alone or in a group)."""
    members = [SinkEntry(m, e.epoch, e.node, e.written_ms) for entries in outputs.values()
               for e in entries for m in e.id.split("+")]
    return check_sink(members, sent_ids)


def check_sink(entries: list[SinkEntry], sent_ids: list[str]) -> SinkReport:
    counts = Counter(e.id for e in entries)
    sent = set(sent_ids)
    lost = sorted(sent - counts.keys())
    dups = sorted(i for i, c in counts.items() if c > 1)
    return SinkReport(
        sent=len(sent),
        delivered=len(sent & counts.keys()),
        lost=len(lost),
        duplicated=sum(c - 1 for c in counts.values()),
        unexpected=len(counts.keys() - sent),
        lost_ids=lost[:20],
        duplicated_ids=dups[:20],
    )


def failover_seconds(entries: list[SinkEntry], old_epoch: int, killed_at: float) -> float | None:
    """Seconds from ``killed_at`` (epoch s) to the first sink write of a newer epoch."""
    for e in entries:
        if e.epoch > old_epoch:
            return e.written_ms / 1000.0 - killed_at
    return None
