"""The master's upkeep of the streams the flow writes: the retention trim, and the counts the
metrics report.

A part of the member (``member.py``), called from the master's trim round
(``member_timers.py``). Each round trims every stream the flow writes (its sinks, its
``out:<node>:<outlink>`` streams, ``failure`` and ``notices``) to the bounds the flow file's
``streams`` section gives it (``runtime/stream_spec.py``), all in one round trip
(``runtime/store/stream_retention.py``); a stream whose count took more than one call's budget
gets more calls, at most ``MAX_CALLS`` a round. Every removed entry that a consumer group had not
read is counted in Redis by the same script, and a round that removed any logs the event
``stream_trimmed_unread`` per stream. The counts in Redis come back with each trim and are kept
for the metrics, which never call Redis at scrape time for them.

Under failure: :meth:`StreamUpkeep.trim` never raises: Redis unreachable (each call tries once)
leaves the streams as they are until the next round, and the counts as last read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..runtime.store.stream_retention import trim_streams
from ..runtime.stream_spec import FAILURE, NOTICES, Retention, written_streams

if TYPE_CHECKING:
    from .member import FlowMember

log = logging.getLogger("twinflow.peer")

MAX_CALLS = 10  # calls one round makes at most for a stream (each pages through at most SCAN_BUDGET entries)


class StreamUpkeep:
    """A member's trim of the streams its flow writes, and their counts (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member
        spec = member.spec
        caps = {FAILURE: spec.failure_max_entries, NOTICES: spec.notices.max_entries}
        self._bounds: list[tuple[str, Retention]] = [
            (name, spec.streams.of(name, caps.get(name)))
            for name in sorted(set(written_streams(member.graph.nodes, member.graph.links).values()))]
        self._counts: dict[str, tuple[int, int]] | None = None

    def bounds(self) -> list[tuple[str, Retention]]:
        """Each stream the flow writes (its name) and its bounds, as the trim applies them."""
        return list(self._bounds)

    def trim(self) -> None:
        """Trim every stream to its bounds at the flow's time, then keep its counts."""
        m = self.m
        removed: dict[str, int] = {}
        unread: dict[str, int] = {}
        due = self._bounds
        try:
            for _ in range(MAX_CALLS):
                done = trim_streams(m.store, due, m.clock.now(), deadline_s=0)
                counts = dict(self._counts or {})
                for t in done:
                    removed[t.stream] = removed.get(t.stream, 0) + t.removed
                    unread[t.stream] = unread.get(t.stream, 0) + t.unread
                    counts[t.stream] = (t.removed_total, t.unread_total)
                self._counts = counts  # one assignment: a scrape sees the last round's or this one's
                due = [(t.stream, b) for t, (_, b) in zip(done, due) if t.more]
                if not due:
                    break
        except Exception as exc:  # noqa: BLE001 - the upkeep waits for the next round
            log.warning("%s: the flow's streams were not trimmed this round: %s: %s", m.cfg.peer_id,
                        type(exc).__name__, exc)
        for stream, count in sorted(unread.items()):
            if count:
                m.event(logging.WARNING, "stream_trimmed_unread",
                        "%s: the retention of stream %s removed %d entries, %d of them not yet read by its "
                        "consumer groups", m.cfg.peer_id, stream, removed[stream], count,
                        stream=stream, removed=removed[stream], count=count)
        if any(removed.values()):
            log.debug("%s: the streams' retention removed %s", m.cfg.peer_id,
                      ", ".join(f"{n} from {s}" for s, n in sorted(removed.items()) if n))

    def counts(self) -> dict[str, tuple[int, int]] | None:
        """Stream name -> (entries the retention removed, of them unread): the flow's counts in Redis
        as the last trim read them, or None before this member's first trim as master."""
        return self._counts
