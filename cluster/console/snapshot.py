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

Under failure: a snapshot never raises for Redis. Every Redis call has a deadline
(``REDIS_DEADLINE_S``: the retrying calls by their deadline, the single reads by the socket
time-out of :func:`console_stores`); when Redis does not answer, the snapshot says so in
``redis`` within seconds and carries no live part, and the page keeps what it drew and shows
Redis down. A part that no peer has written yet (the events stream of a flow that never
failed over) is empty.
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
        """The page's data now (see the module doc); never raises for Redis."""
        now = self.clock()
        out = {"flow": self.graph.name, "at": now, "redis": "ok", "shards": len(self.stores),
               "peers": [], "outlinks": {}, "links": {}, "uplink": {}, "epoch": 0, "failovers": [], "events": [],
               "failures": {}, "suspended": {}}
        try:
            with self._lock:
                self._read(out, now)
        except (redis.RedisError, RedisUnavailable, OSError) as exc:
            out["redis"] = f"Redis did not answer: {exc}"
        return out

    def _read(self, out: dict, now: float) -> None:
        counts: dict[str, int] = {}
        uplink = 0
        for k, store in enumerate(self.stores):
            shard = store.keys.flow
            seconds, micros = store.r.time()  # the flow's clock, which the peers' statuses are on
            for row in store.read_statuses(deadline_s=REDIS_DEADLINE_S):
                row["uplink_lag"], row["uplink_lag_s"] = store.uplink_behind(row["peer_id"])
                row["shard"] = shard
                # A status is written every half second and lapses after 5 s: one not written for
                # longer than SILENT_S is a peer gone (killed, cut off) whose last word is still there.
                at = float(row.get("at") or 0)
                row["age_s"] = round(seconds + micros / 1e6 - at, 3) if at else None
                row["silent"] = row["age_s"] is not None and row["age_s"] > SILENT_S
                out["peers"].append(row)
            added = self._entries_added(store, [store.keys.uplink, *(s for _, s in self.streams[k])])
            uplink += added[0]
            for (name, _), n in zip(self.streams[k], added[1:]):
                counts[name] = counts.get(name, 0) + n
            out["epoch"] = max(out["epoch"], store.current_epoch(deadline_s=REDIS_DEADLINE_S))
            out["suspended"].update(store.suspensions(deadline_s=REDIS_DEADLINE_S))
            out["events"] += self._events(store)
        links: dict[str, int] = {}
        for row in out["peers"]:  # each shard's master, while it writes: what its term's links took
            if row.get("role") == "master" and not row["silent"] and isinstance(row.get("links"), dict):
                for name, n in row["links"].items():
                    links[name] = links.get(name, 0) + int(n)
        out["links"] = {name: {"count": n, "rate": self._rates.rate("link " + name, now, n)}
                        for name, n in links.items()}
        out["uplink"] = {"count": uplink, "rate": self._rates.rate("uplink", now, uplink)}
        out["outlinks"] = {name: {"count": n, "rate": self._rates.rate(name, now, n)} for name, n in counts.items()}
        out["events"].sort(key=lambda e: e.get("at") or 0, reverse=True)
        out["failovers"] = failovers(out["events"])
        out["events"] = out["events"][:EVENTS_SHOWN]
        out["failures"] = self.failures.counts()

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
