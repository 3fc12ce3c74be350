"""What the console page shows, read from Redis once per poll: :class:`ConsoleView`.

The flow's shape comes from its flow file (:func:`flow_shape`, read once); everything live
comes from what the peers already keep in Redis:

- each peer's status hash (``tf:{F}:node:<peer>``, written every half second): role, epoch,
  address, lag, last batch, what each node holds, suspensions; and how old it is on Redis's
  clock, so that a peer that stopped writing (killed, cut off) shows as silent before its
  status lapses;
- the count of every stream a message leaves the flow by, and of the uplink: ``XINFO
  STREAM``'s ``entries-added``, which counts every entry ever added (a trimmed stream
  still counts what was trimmed), so a count is the cluster's, not one peer's since its
  start; a rate is the difference between two polls;
- the flow's events stream (``tf:{F}:events``): the failover timeline (:mod:`.failovers`);
- the FAILED audit's counts;
- on the links inside the flow, what the master's term sent along each (its status's
  ``links``, counted by the engine): a count since the master took the role (a failover
  starts it again), and its rate.

Cost: a poll makes O(peers + outlinks) Redis calls, one pipeline for the counts, and
nothing per message.

Under failure: a snapshot never raises, for Redis or for what Redis holds. Every Redis call
has a deadline (``REDIS_DEADLINE_S``: the retrying calls by their deadline, the single reads
by the socket time-out of :func:`console_stores`); when Redis does not answer, the snapshot
says so in ``redis`` within seconds and carries no live part, and the page keeps what it drew
and shows Redis down. A value that is not what the peers write (a suspension record, a
status's ``pending_nodes`` or ``links`` that is not JSON of the right shape) is named in its
row's ``malformed``, or, when it spoils a whole part, in ``problems`` under the part's name:
the rest of the snapshot is whole. A part that no peer has written yet (the events stream of
a flow that never failed over) is empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

import redis

from ...runtime.flowgraph import FlowGraph
from ...runtime.store.flow_store import FlowStore
from ...runtime.store.store_errors import RedisUnavailable
from ..flow_failures import FlowFailures
from ..master_flow import outlink_streams
from ..operator_stores import operator_stores
from .failovers import failovers

log = logging.getLogger("twinflow.console")

RATE_WINDOW_S = 5.0     # a rate is the count's change over about this long
EVENTS_SHOWN = 30       # the newest events the page lists
REDIS_DEADLINE_S = 2.0  # each Redis call of the console waits at most this long (console_stores too)
_UNAVAILABLE = (redis.RedisError, RedisUnavailable, OSError)
SILENT_S = 2.0          # a peer whose status is older than this is shown as silent (it writes every 0.5 s)


def console_stores(graph: FlowGraph, url: str, who: str) -> list[FlowStore]:
    """The flow's stores as the console opens them: every call and every socket read bounded by
    ``REDIS_DEADLINE_S``, so that a page's request answers within seconds whatever Redis does."""
    return operator_stores(graph, url, who=who, deadline_s=REDIS_DEADLINE_S)


def flow_shape(graph: FlowGraph) -> dict:
    """The flow as the flow file declares it: its nodes (name, type, outlinks, the action a sort
    pairs with) and its links; an outlink no link takes leaves the flow."""
    nodes = []
    for name, node in graph.nodes.items():
        entry = {"name": name, "kind": node.kind, "outlinks": list(node.outlinks)}
        pairs = getattr(node, "pairs_with", None)
        if pairs:
            entry["pairs_with"] = pairs
        nodes.append(entry)
    pair = graph.cluster.pair if graph.cluster else None
    if pair is not None:  # the worker's claim-mode sort: not a node of the master's graph
        nodes.append({"name": pair.sort, "kind": "sort", "outlinks": [_unclaimed(pair)], "pairs_with": pair.action,
                      "rulesets": list(pair.rules.baking)})
    links = [{"from": name, "outlink": outlink, "to": nxt}
             for name, outs in graph.links.items() for outlink, nxt in outs.items()]
    return {"flow": graph.name, "input": graph.input, "nodes": nodes, "links": links}


def _unclaimed(pair) -> str:
    """The sort's outlink that its unclaimed messages leave by (one stream, ``tf:{F}:unclaimed``)."""
    return pair.outlink_name(pair.unclaimed_outlink)


class _Rates:
    """Counts sampled at each poll, and the rate each changed at over the last window."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self.samples: dict[str, deque] = {}

    def rate(self, name: str, now: float, count: int) -> float:
        ring = self.samples.setdefault(name, deque())
        ring.append((now, count))
        while len(ring) > 2 and now - ring[1][0] >= self.window_s:  # keep one sample older than the window
            ring.popleft()
        then, before = ring[0]
        return round(max(0, count - before) / (now - then), 2) if now > then else 0.0


class ConsoleView:
    """The live snapshot of the flow ``graph`` whose shards' stores are ``stores``."""

    def __init__(self, graph: FlowGraph, stores: list[FlowStore], *, clock: Callable[[], float] = time.time):
        self.graph, self.stores, self.clock = graph, stores, clock
        self.shape = flow_shape(graph)
        spec = graph.cluster
        self.failures = FlowFailures(graph.name, stores, max_bytes=spec.message.max_bytes if spec else 1 << 20,
                                     replicas=spec.wait_replicas if spec else 0,
                                     replica_wait_ms=spec.replica_wait_ms if spec else 1000,
                                     deadline_s=REDIS_DEADLINE_S)
        # (node.outlink, stream) per shard: outlinks that share a stream (two actions, one sink) share its count.
        self.streams = [sorted((f"{node}.{outlink}", stream) for (node, outlink), stream
                               in outlink_streams(graph, store.keys).items()) for store in stores]
        pair = spec.pair if spec else None
        if pair is not None:
            for store, streams in zip(stores, self.streams):
                streams.append((f"{pair.sort}.{_unclaimed(pair)}", store.keys.unclaimed))
        self._rates = _Rates()
        self._lock = threading.Lock()  # polls from several browsers share the rate samples

    def snapshot(self) -> dict:
        """The page's data now (see the module doc); never raises for Redis, nor for a bad value."""
        now = self.clock()
        out = {"flow": self.graph.name, "at": now, "redis": "ok", "shards": len(self.stores),
               "peers": [], "outlinks": {}, "links": {}, "uplink": {}, "epoch": 0, "failovers": [], "events": [],
               "failures": {}, "suspended": {}, "problems": {}}
        try:
            with self._lock:
                self._read(out, now)
        except _UNAVAILABLE as exc:
            out["redis"] = f"Redis did not answer: {exc}"
        return out

    def _read(self, out: dict, now: float) -> None:
        # Each part is read on its own: a value in Redis that is not what the peers write (by hand,
        # by another version, corrupted) spoils its own part, named in "problems", not the snapshot.
        # Redis not answering ends the whole read (the caller says so).
        counts: dict[str, int] = {}
        uplink = 0
        for k, store in enumerate(self.stores):
            self._part(out, "peers", lambda: self._peers(out, store))
            added = self._part(out, "counts", lambda: self._entries_added(
                store, [store.keys.uplink, *(s for _, s in self.streams[k])])) or []
            if added:
                uplink += added[0]
                for (name, _), n in zip(self.streams[k], added[1:]):
                    counts[name] = counts.get(name, 0) + n
            epoch = self._part(out, "epoch", lambda: store.current_epoch(deadline_s=REDIS_DEADLINE_S))
            out["epoch"] = max(out["epoch"], epoch or 0)
            out["suspended"].update(self._part(out, "suspended", lambda: store.suspension_records(
                deadline_s=REDIS_DEADLINE_S)) or {})
            out["events"] += self._part(out, "events", lambda: self._events(store)) or []
        links: dict[str, int] = {}
        for row in out["peers"]:  # each shard's master, while it writes: what its term's links took
            if row.get("role") == "master" and not row.get("silent") and isinstance(row.get("links"), dict):
                for name, n in row["links"].items():
                    links[str(name)] = links.get(str(name), 0) + n
        out["links"] = {name: {"count": n, "rate": self._rates.rate("link " + name, now, n)}
                        for name, n in links.items()}
        out["uplink"] = {"count": uplink, "rate": self._rates.rate("uplink", now, uplink)}
        out["outlinks"] = {name: {"count": n, "rate": self._rates.rate(name, now, n)} for name, n in counts.items()}
        events = self._part(out, "events", lambda: sorted(out["events"], key=_event_time, reverse=True)) or []
        out["failovers"] = self._part(out, "failovers", lambda: failovers(events)) or []
        out["events"] = events[:EVENTS_SHOWN]
        out["failures"] = self._part(out, "failures", self.failures.counts) or {}

    @staticmethod
    def _part(out: dict, name: str, read: Callable):
        """``read()``, or None with ``out["problems"][name]`` saying what was malformed."""
        try:
            return read()
        except _UNAVAILABLE:
            raise
        except Exception as exc:  # a malformed value: shown in its own panel, the rest goes on
            log.warning("console: a malformed value in Redis spoils the %s panel: %r", name, exc)
            out["problems"][name] = f"a value in Redis is malformed: {type(exc).__name__}: {str(exc)[:200]}"
            return None

    def _peers(self, out: dict, store: FlowStore) -> None:
        seconds, micros = store.r.time()  # the flow's clock, which the peers' statuses are on
        for row in store.read_statuses(deadline_s=REDIS_DEADLINE_S):
            row["shard"] = store.keys.flow
            try:
                row["uplink_lag"], row["uplink_lag_s"] = store.uplink_behind(str(row.get("peer_id")))
            except _UNAVAILABLE:
                raise
            except Exception:  # its read position is malformed: this row says so, the others are whole
                _malformed(row, "uplink_lag")
                row["uplink_lag"] = row["uplink_lag_s"] = None
            # A status is written every half second and lapses after 5 s: one not written for
            # longer than SILENT_S is a peer gone (killed, cut off) whose last word is still there.
            at = _number(row.get("at"))
            if at is None and row.get("at"):
                _malformed(row, "at")
            row["age_s"] = round(seconds + micros / 1e6 - at, 3) if at else None
            row["silent"] = row["age_s"] is not None and row["age_s"] > SILENT_S
            links = row.get("links")
            if links is not None and not (isinstance(links, dict) and all(
                    isinstance(n, int) and not isinstance(n, bool) for n in links.values())):
                _malformed(row, "links")  # not counted: shown as bad on its row
                row["links"] = None
            if "pending_nodes" in row and not isinstance(row["pending_nodes"], dict):
                _malformed(row, "pending_nodes")
                row["pending_nodes"] = None
            out["peers"].append(row)

    @staticmethod
    def _entries_added(store: FlowStore, streams: list[str]) -> list[int]:
        """Each stream's ``entries-added`` (0 for one not written yet), in one pipeline."""
        pipe = store.r.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_stream(stream)
        replies = pipe.execute(raise_on_error=False)
        return [int(r.get("entries-added", 0)) if isinstance(r, dict) else 0 for r in replies]

    @staticmethod
    def _events(store: FlowStore) -> list[dict]:
        return store.events(count=200, deadline_s=REDIS_DEADLINE_S)


def _malformed(row: dict, field: str) -> None:
    """Name ``field`` in the row's ``malformed`` (once: the store may have named it already)."""
    named = row.setdefault("malformed", [])
    if field not in named:
        named.append(field)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _event_time(event: dict) -> float:
    return _number(event.get("at")) or 0.0
