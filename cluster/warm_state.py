"""A worker's warm copy of the state that grows with the traffic, so that a promotion need not read it whole.

A new master must start from exactly the state the old one committed. The
history holds every identifier of its retention, and reading it whole costs
time that grows with it (about 4 µs per identifier, ``bench/state_load.py``),
on the failover's recovery time. So a worker keeps the nodes that log their
state changes (``Node.logs_state_changes``: the history) loaded, follows the
flow's change log each timer round (``runtime/store/change_log.py``), and at
promotion applies only the steps committed since; the other nodes' state (open
groups, retries: bounded by what is open, not by the traffic) is read whole as
before, in the same read.

Under failure it promises never to hand over state that Redis does not hold:

- the copy applies log entries in order, each only when it carries the version
  after the one the copy holds (a log trimmed past the copy, or a step of a
  master that wrote no log, shows as a gap);
- the entry applied last must still be in the log with its step's token (a
  Redis failover that lost it, or a step written again at the same stream ID,
  shows here);
- at promotion the copy must reach exactly the version read, in one MULTI/EXEC,
  with the tail, the mark and the other nodes' state.

Anything else (a gap, a lost anchor, a Redis error, an entry it cannot apply)
drops the copy: the promotion then loads the state whole, as one without a copy does, and the
worker primes a new copy on a later round (at once after one drop, then backing
off, so that a worker that keeps falling behind does not read the history whole
every round). A copy handed to a promotion is the
master's from then on; a worker that is demoted primes again.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Callable

from ..runtime.flowgraph import FlowGraph
from ..runtime.nodes.base import Node
from ..runtime.store.change_log import ChangesRead, LogEntry
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.step import CHANGE_LOG_STEPS
from .flow_audit import RESUBMITS
from .master_flow import MasterFlow, collector_paused, loaded_graph, logged_nodes

log = logging.getLogger("twinflow.peer")


class Gap(RuntimeError):
    """The copy cannot be brought to the state Redis holds from the log."""


# How long after a drop the copy is primed again: the first drop at once (a promotion between
# the drop and the prime would read the state whole anyway), then longer after each drop in a
# row, since a prime reads the whole history (about 4 µs per identifier).
PRIME_BACKOFF_S = (0.0, 1.0, 4.0, 15.0, 60.0)


class WarmState:
    """The logged nodes of one flow (or shard) kept at the version Redis holds; see the module doc."""

    def __init__(self, graph: FlowGraph, store: FlowStore, count: int = CHANGE_LOG_STEPS,
                 monotonic: Callable[[], float] = time.monotonic):
        self.graph, self.store, self.count = graph, store, count
        self.monotonic = monotonic
        # After a drop the next prime waits, longer after each drop in a row (PRIME_BACKOFF_S):
        # a worker that keeps falling behind the log must not read the history whole every round.
        self._prime_at = float("-inf")
        self._drops_in_a_row = 0
        self.logged = logged_nodes(graph)
        self._lock = threading.Lock()  # one follow or one hand-over at a time
        self._nodes: dict[str, Node] | None = None  # None: no copy (prime on the next follow)
        self._version = 0
        self._anchor: LogEntry | None = None  # the log entry applied last (None: none yet)
        self.primes = 0      # copies primed (whole reads)
        self.applied = 0     # log entries applied
        self.dropped = 0     # copies dropped on a gap or an error

    @property
    def ready(self) -> bool:
        return self._nodes is not None

    def follow(self, deadline_s: float | None = None) -> None:
        """Prime the copy if there is none, else apply what the log holds since (a worker's timer
        round). A gap drops the copy (primed again next time); a Redis error leaves it as it is."""
        if not self.logged:
            return
        with self._lock:
            if self._nodes is None:
                if self.monotonic() >= self._prime_at:
                    self._prime(deadline_s)
                return
            read = self.store.changes_since(self._anchor, self.count, deadline_s=deadline_s)
            try:
                self._apply(read, to_version=None)
            except Gap as gap:
                self._drop(f"{gap}")
                return
            if read.tail:
                self._drops_in_a_row = 0

    def take(self, deadline_s: float | None = None) -> MasterFlow | None:
        """The flow for a new master: the copy brought to the version Redis holds, with the other
        nodes' state read whole in the same read; None when there is no copy or it cannot be
        brought there (the caller loads the state whole). The copy is the flow's from now on."""
        with self._lock:
            if self._nodes is None:
                return None
            others = [name for name in self.graph.nodes if name not in self._nodes] + [RESUBMITS]
            with collector_paused():  # no collection walking the heap on the promotion's path
                try:
                    # The whole tail: a promotion applies everything since the last round.
                    read = self.store.changes_since(self._anchor, 1 << 30, others, deadline_s=deadline_s)
                    self._apply(read, to_version=read.version)
                except Gap as gap:
                    self._drop(f"{gap}")
                    return None
                nodes = self._nodes
                self._nodes, self._anchor, self._version = None, None, 0  # the new master's from now on
                inflight = read.entries.pop(RESUBMITS)
                fresh = loaded_graph(self.graph, read.entries)
            fresh.nodes.update(nodes)
            return MasterFlow.resume(fresh, self.store, read.mark, read.version, inflight)

    # -- inside the lock --------------------------------------------------
    def _prime(self, deadline_s: float | None) -> None:
        entries, version, last = self.store.load_state_logged(self.logged, deadline_s=deadline_s)
        fresh = loaded_graph(self.graph, entries)
        self._nodes = {name: fresh.nodes[name] for name in self.logged}
        self._version, self._anchor = version, last
        self.primes += 1
        # Age the copy now, on the worker's round: its objects are all young, and the first
        # collection of the younger generations to meet them walks every one (about 100 ms per
        # 100,000 identifiers, measured), which must not happen during a promotion.
        gc.collect(1)

    def _apply(self, read: ChangesRead, to_version: int | None) -> None:
        """Apply ``read``'s tail in order; raise Gap when it does not follow on from the copy, or
        (``to_version``) does not end at that version."""
        if self._anchor is not None and (read.anchor is None or read.anchor.token != self._anchor.token):
            raise Gap(f"the log no longer holds the entry applied last ({self._anchor.id}): "
                      "Redis failed over, or the log was rewritten")
        if read.version < self._version:
            raise Gap(f"Redis holds state version {read.version}, behind the copy's {self._version}")
        for entry in read.tail:
            if entry.version != self._version + 1:
                raise Gap(f"the log goes from version {self._version} to {entry.version}")
            try:
                for name, changes in entry.changes.items():
                    self._nodes[name].apply_state(changes)
            except Exception as exc:  # noqa: BLE001 - a copy it cannot apply is dropped, not used
                raise Gap(f"log entry {entry.id} could not be applied: {type(exc).__name__}: {exc}") from exc
            self._version, self._anchor = entry.version, entry
            self.applied += 1
        if to_version is not None and self._version != to_version:
            raise Gap(f"the log reaches version {self._version}, Redis holds {to_version}")

    def _drop(self, why: str) -> None:
        self._nodes, self._anchor, self._version = None, None, 0
        self.dropped += 1
        wait = PRIME_BACKOFF_S[min(self._drops_in_a_row, len(PRIME_BACKOFF_S) - 1)]
        self._drops_in_a_row += 1
        self._prime_at = self.monotonic() + wait
        log.info("warm state dropped (%s); primed again in %.0f s", why, wait)
