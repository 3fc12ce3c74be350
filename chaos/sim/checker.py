"""The failover simulator's checker: after every step, what left the flow (its output streams
and its failure stream) read from where the last check left off, against the step-wise promises.

It holds :class:`Checker` only; the run loop (``simulator.py``) calls ``check()`` after each
step and fails the run on what it returns. Under failure it promises to report, never to
excuse: a message that left twice, by the flow and by the failure path, or never published;
two writers at one epoch; a write at a stale epoch; a document re-sent under a new ID that
leaves as anything but a duplicate while the history still holds it. Its only excuses are the
ones it names:
a re-published ID after its ``id_ttl``, and, after a Redis failover (read again from the
start), what the failover erased, counted (and a failure with ``wait_replicas`` set).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

from ...cluster.master_flow import outlink_streams
from ...cluster.on_cluster import flow_keys
from ...runtime.flowgraph import FlowGraph
from ...runtime.nodes.history import DUPLICATE, HistoryNode
from ...testing.checker import SinkEntry, Tally, read_sink_after
from .world import START_TIME, World


def in_write_order(new: dict[str, list[tuple[str, SinkEntry]]]) -> Iterator[tuple[str, SinkEntry]]:
    """(stream, entry) for the new entries of every output stream, as Redis wrote them, so that
    a stale write is judged against the epochs written before it, not those of the streams read
    before its own. One step may hold many COMMITs of two epochs (a step whose COMMITs are in
    flight while another node promotes and writes), so reading stream after stream would find an
    old master's last entries after a new master's, in a stream read earlier, written later.

    Each stream keeps its own order (exact: a stale write within one stream is always seen).
    Across streams the order is the entries' Redis time (milliseconds); entries of two streams
    written in the same millisecond (virtual time often stands still) cannot be ordered, and are
    taken older epoch first: a stale write is then seen in its own stream or at another
    millisecond, never made up by the order the streams are read in."""
    runs = [[(stream, e) for _, e in entries] for stream, entries in new.items()]
    return heapq.merge(*runs, key=lambda se: (se[1].written_ms, se[1].epoch))


@dataclass(frozen=True)
class DuplicateExit:
    """Where a document the flow's history has seen must leave when it comes again under a new
    message ID: the input node's ``duplicate`` stream, while ``retention`` has not passed
    since the first was published (the history recorded it no earlier)."""

    stream: str
    retention: float
    uuid_field: str

    def judge(self, mid: str, stream: str, first_published: float, now: float) -> str | None:
        """The problem when ``mid``, re-sending a document first published at ``first_published``,
        left via ``stream`` (seen at ``now``); None when that is how it may leave. The history
        recorded the first no earlier than it was published, and ``mid`` left no later than now,
        so within the retention of that the history still held it."""
        if stream == self.stream or now - first_published >= self.retention:
            return None
        return (f"{mid} re-sent a document first published {now - first_published:.1f} s before (within "
                f"the history's retention, {self.retention:g} s) and left via {stream}, not {self.stream}")


def duplicate_exit(graph: FlowGraph) -> DuplicateExit | None:
    """The flow's :class:`DuplicateExit`, when its input is a history node keyed by a top-level
    field whose ``duplicate`` outlink leaves the flow; None for any other flow (nothing to check)."""
    node = graph.nodes[graph.input]
    if not isinstance(node, HistoryNode) or len(node.uuid_path.parts) != 1:
        return None
    stream = outlink_streams(graph, flow_keys(graph)).get((graph.input, DUPLICATE))
    return None if stream is None else DuplicateExit(stream, node.retention, str(node.uuid_path.parts[0]))


class Checker:
    """Reads each output stream and the failure stream from where it left off and checks the
    step-wise promises.

    Re-published IDs and ID expiry: a producer's retry of a message whose ID expired from the ID
    cache (``message.id_ttl``) is a new message to the flow, and may leave again; any other
    second leave is a duplicate. The second leave is taken as after expiry only when the check
    that saw it is at least ``id_ttl`` after the first COMMIT that put the ID in the cache (the
    Redis model records when, ``World.cached_at``), and only for IDs the producer published more
    than once.

    Business re-sends (``Schedule.resend``): a message with a new ID and the document of one that
    already left the flow leaves exactly once, and through the history's ``duplicate`` stream
    while the first is within the history's retention (:class:`DuplicateExit`): a new master that
    forgot the history would send it on as new.

    Hostile messages (``hostile.py``) leave exactly once, through the flow (by their ID) or by
    the failure path (by their uplink position, with a reason); never both, never neither.

    Writers: a step's new entries are judged in the order Redis wrote them across the output
    streams (:func:`in_write_order`), not stream after stream.

    Redis failover (``Replica.failover``): the streams are read again from the start, since a
    failover may erase their last entries. With ``wait_replicas`` it must erase no output;
    without, what it erased is counted (``RunResult.counts``).
    """

    def __init__(self, world: World, published: Counter, hostiles: dict, good: dict, id_ttl: float,
                 resent: dict[str, float] | None = None):
        keys = flow_keys(world.graph)
        self.id_prefix = keys.id_prefix
        self.world = world
        self.streams = list(outlink_streams(world.graph, keys).values())
        self.failure = keys.failure
        self.after = {s: "0-0" for s in [*self.streams, self.failure]}
        self.tally = Tally()                         # the shared counting core: leavings, writers per epoch
        self.failed: Counter = Counter()             # uplink position -> records on the failure stream
        self.first_failed: dict[str, float] = {}
        self.published, self.hostiles, self.good, self.id_ttl = published, hostiles, good, id_ttl
        # Re-sent ID -> when the document it carries was first published (Schedule.resend).
        self.resent = resent if resent is not None else {}
        self.duplicate_exit = duplicate_exit(world.graph)
        self.allowed: Counter = Counter()            # leaves excused by ID expiry, per ID
        self.resubmit_allowed: Counter = Counter()   # leaves excused by an operator's resubmit, per ID
        self.counts: Counter = Counter()
        self._commits_seen = -1
        self._records_seen = -1
        self._failovers = 0
        self.erased_failures: set[str] = set()   # positions whose failure record a failover erased
        self.step_began = START_TIME

    @property
    def left(self) -> Counter:
        """Message ID -> times it left the flow."""
        return self.tally.left

    def _resync(self, problems: list[str]) -> None:
        """After a Redis failover: what left is what the streams hold now."""
        before = self.tally.left
        self.tally.left = Counter()
        for stream in self.streams:
            self.after[stream] = "0-0"
        self._read_outputs([], recount=True)
        erased = before - self.left
        if erased:
            n = sum(erased.values())
            self.counts["failover_erased_outputs"] += n
            if self.world.dims.wait:
                problems.append(f"a Redis failover erased {n} outputs that had left the flow with "
                                f"wait_replicas set ({', '.join(sorted(erased)[:5])})")
        self.after[self.failure] = "0-0"
        before_failed, self.failed = self.failed, Counter()
        self._read_failures([], recount=True)
        gone = before_failed - self.failed
        if gone:
            self.counts["failover_erased_failures"] += sum(gone.values())
            self.erased_failures.update(gone)

    def check(self) -> list[str]:
        problems: list[str] = []
        replica = self.world.replica
        if replica is not None and replica.failovers != self._failovers:
            self._failovers = replica.failovers
            # What left since the last look is judged as usual first (a duplicate or a stale
            # write in the step of the failover must not hide in the recount), then recounted.
            self._read_failures(problems)
            self._read_outputs(problems)
            self._resync(problems)
        if self.world.commits[1] != self._records_seen:
            self._records_seen = self.world.commits[1]
            self._read_failures(problems)
        while self.world.stops:
            problems.append(self.world.stops.pop(0))
        while self.world.turns.errors:  # a peer's thread died of an error: its process lives on without it
            problems.append(self.world.turns.errors.pop(0))
        problems.extend(self.world.leadership_problems())
        if self.world.commits[0] == self._commits_seen:
            return problems  # no commit since the last check: no output can have been written
        self._commits_seen = self.world.commits[0]
        self._read_outputs(problems)
        return problems

    def _read_outputs(self, problems: list[str], recount: bool = False) -> None:
        now = self.world.clock.now()
        failed_ids = self.failed_ids()  # the failure stream is not read meanwhile
        new = {}
        for stream in self.streams:
            new[stream] = read_sink_after(self.world.redis, stream, self.after[stream])
            if new[stream]:
                self.after[stream] = new[stream][-1][0]
        for stream, e in in_write_order(new):
            again = self.tally.count(e)
            if recount:
                continue
            for member in e.id.split("+"):
                if member in again:
                    if self._expired_again(member, now) or self._resubmitted_again(member):
                        continue
                    problems.append(f"{member} left the flow {self.left[member]} times "
                                    f"(again via {stream}, peer {e.peer}, epoch {e.epoch})")
                if member in failed_ids:
                    problems.append(f"{member} left the flow and by the failure path")
                if member in self.resent and self.duplicate_exit is not None:
                    problem = self.duplicate_exit.judge(member, stream, self.resent[member], now)
                    if problem:
                        problems.append(problem)
            problems.extend(self.tally.judge_writer(e))

    def _expired_again(self, member: str, now: float) -> bool:
        """A second leave that a re-published message may make once its ID expired."""
        extra = self.left[member] - 1 - self.resubmit_allowed[member]
        # Only id_ttl after the first COMMIT that put it in the ID cache can it be new again.
        since = self.world.cached_at.get(self.id_prefix + member)
        if (since is not None and now - since >= self.id_ttl and self.published[member] > extra
                and self.allowed[member] < extra):
            self.allowed[member] += 1
            self.counts["left_again_after_id_ttl"] += 1
            return True
        return False

    def _resubmitted_again(self, member: str) -> bool:
        """A second leave of a message an operator resubmitted: one more per resubmit."""
        guarded = self.world.guarded
        if guarded is None or self.resubmit_allowed[member] >= guarded.resubmits_of()[member]:
            return False
        self.resubmit_allowed[member] += 1
        self.counts["left_again_resubmitted"] += 1
        return True

    def failed_ids(self) -> set:
        return {self.hostiles.get(p) for p in self.failed} - {None}

    def _read_failures(self, problems: list[str], recount: bool = False) -> None:
        now = self.world.clock.now()
        entries = self.world.redis.xrange(self.failure, min="(" + self.after[self.failure])
        for eid, fields in entries:
            self.after[self.failure] = eid.decode()
            f = {k.decode(): v for k, v in fields.items()}
            position = f.get("position", b"").decode()
            reason = f.get("reason", b"").decode("utf-8", "replace")
            self.failed[position] += 1
            self.first_failed.setdefault(position, self.step_began)
            if recount:
                continue
            if not reason:
                problems.append(f"uplink entry {position} left by the failure path without a reason")
            if position in self.good:
                problems.append(f"a good message ({self.good[position]}, at {position}) left by the failure "
                                f"path: {reason}")
            elif position not in self.hostiles:
                problems.append(f"uplink entry {position}, never published, left by the failure path")
            if self.failed[position] > 1:
                if now - self.first_failed[position] >= self.id_ttl:
                    # Its seen-marker lives id_ttl: an entry read again after that is recorded again.
                    self.counts["failed_again_after_id_ttl"] += 1
                else:
                    problems.append(f"uplink entry {position} left by the failure path {self.failed[position]} "
                                    f"times ({reason})")
            hid = self.hostiles.get(position)
            if hid is not None and self.left[hid]:
                problems.append(f"{hid!r} (at {position}) left the flow and by the failure path ({reason})")
