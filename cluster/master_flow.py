"""The master's half of a flow: the flow graph run over uplink messages, its node state in Redis.

The master runs the same ``Node`` objects and the same ``Engine`` as
``twinflow replay``. Each batch (and each timer firing) becomes one
:class:`~twinflow.runtime.store.step.Step`: what left the flow through every
unlinked outlink, every node state entry that changed, the IDs processed and
the last uplink position handled, written by one fenced COMMIT script.

Under failure: the nodes in this process are a write-through cache of the
state in Redis, valid only while this peer is master at one epoch and every
step it ran was committed. When a commit fails or is refused, or the peer
stops being master, the caller drops this object; the next master step
starts from :meth:`MasterFlow.load`, which rebuilds every node from Redis.
So a newly promoted master carries on with exactly the state the old one
committed, and a step that was not committed is run again from the uplink.

When a message is processed (the rule that decides what the master
escalates, and what a promoted worker never runs through the graph again):
a message is processed once the COMMIT of the step that took it succeeded.
That step records its ID and moves the processed mark past its position,
and it holds the message's whole effect, per node:

- action: delivered (its ``done`` emission is on the sink), sent to
  ``error``/``failure``, or held for a retry (the retry is a state entry);
- join: passed, discarded, joined or sent to ``nohit``/``failure``, or held
  in an open AND group (the group is a state entry with the message in it);
- history: sent to ``new``, ``duplicate``, ``in_doubt`` or ``failure``, with
  its history entry written in the same step (with ``completion: external``
  the "processing" entry is in Redis before the step is built on: written by
  ``write_started`` before the handler downstream runs, so a master that
  dies inside the handler leaves the message In Doubt, not New);
- any node: an emission on a linked outlink is taken by the next node in the
  same step, so the rule applies again there.

Nothing is processed in part: a step is committed whole or not at all. What a
message leaving the flow records beside its output (a FAILED audit entry, a
resubmit's outcome, a publisher's error notice: ``flow_audit.py``) is part of
the same step. A resubmitted message (``runtime/resubmit.py``) enters at the
node it failed at, under its original ID.

>>> from twinflow.runtime.flowgraph import parse_graph
>>> g = parse_graph("flow: f\\nnodes:\\n  a: {type: action}\\n")
>>> flow = MasterFlow(g, FlowKeys("f"), "node-a")
>>> step = flow.run([Message("m1", None, "5-0", b'{"id": "m1"}', {"id": "m1"})], now=1.0, epoch=3)
>>> from twinflow.runtime.store.step import output_fields
>>> step.mark, step.ids, step.outputs[0][0], output_fields(step.outputs[0])["outlink"]
('5-0', ['m1'], 'tf:{f}:out:a:done', 'done')
"""

from __future__ import annotations

import gc
import json
import logging
from collections import Counter
from contextlib import contextmanager
from operator import itemgetter
from typing import Any

from ..runtime.engine import Engine
from ..runtime.flowgraph import FlowGraph
from ..runtime.json_text import compact
from ..runtime.message import Message, Resubmitted
from ..runtime.positions import position_order
from ..runtime.nodes.base import Emit
from ..runtime.store.store_errors import Fenced, RedisUnavailable
from ..runtime.store.flow_keys import FlowKeys
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.step import SharedFields, Step
from ..runtime.stream_spec import outlink_stream
from ..logs import event
from .flow_audit import RESUBMITS, StepAudit


def outlink_streams(graph: FlowGraph, keys: FlowKeys) -> dict[tuple[str, str], str]:
    """The Redis stream of every (node, outlink) through which messages leave the flow: an
    action's ``done`` goes to its sink, any other to ``tf:{F}:out:<node>:<outlink>``."""
    return {(name, outlink): keys.prefix + outlink_stream(name, node, outlink)
            for name, node in graph.nodes.items() for outlink in node.outlinks
            if outlink not in graph.links.get(name, {})}


def logged_nodes(graph: FlowGraph) -> tuple[str, ...]:
    """The flow's nodes whose state changes each step also writes to the change log (the
    history: state that grows with the traffic, kept warm by a worker, ``warm_state.py``)."""
    return tuple(name for name, node in graph.nodes.items() if node.logs_state_changes)


log = logging.getLogger("twinflow.master")


def guards_handlers(graph: FlowGraph) -> bool:
    """Whether a history node with external completion guards a handler: its "processing"
    entries must reach Redis before the handler runs (``MasterFlow.write_started``)."""
    return any(getattr(node, "external", False) for node in graph.nodes.values())


def not_on_cluster(graph: FlowGraph) -> list[str]:
    """The master's nodes whose state cannot live in Redis yet (they run in replay only)."""
    return [f"{name} ({node.kind})" for name, node in graph.nodes.items() if not node.state_in_redis]


class MessageRefused(RuntimeError):
    """The flow raised an error while taking ``msg``: the message is bad input (it goes to the
    failure stream with ``reason``), and the flow that raised it is part-way through it, so
    its caller must drop it and build the step again without the message."""

    def __init__(self, msg: Message, reason: str):
        super().__init__(reason)
        self.msg, self.reason = msg, reason


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block (back as it was after).

    Loading the state makes a few objects per entry and keeps them all, so the collector
    would run again and again over a heap that only grows: measured on 50,000 history
    entries (bench/state_load.py), it doubled the time a new master takes to load before it
    delivers anything. Nothing in the block makes cycles that need collecting.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def loaded_graph(graph: FlowGraph, entries: dict[str, dict[str, Any]]) -> FlowGraph:
    """``graph`` with every node new, and each node named in ``entries`` given its state entries."""
    fresh = graph.fresh()
    with collector_paused():
        for name, node_entries in entries.items():
            fresh.nodes[name].load_state(node_entries)
    return fresh


class MasterFlow:
    """One master's flow graph at one epoch; see the module docstring."""

    def __init__(self, graph: FlowGraph, keys: FlowKeys, peer_id: str):
        self.graph = graph
        self.keys = keys
        self.peer_id = peer_id
        self.engine = Engine(graph, leave=self._leave)
        self.logged = logged_nodes(graph)
        self._step: Step | None = None
        self._epoch = 0
        self._bodies: dict[str, Message] = {}  # this step's messages by ID: the sink keeps their bytes
        # This step's outputs' shared leading fields, by (node, outlink, time, the names that follow).
        self._shared: dict[tuple, SharedFields] = {}
        self._streams = outlink_streams(graph, keys)
        # What leaving messages record beside their outputs: audit, outcomes, notices (flow_audit.py).
        self.audit = StepAudit(graph, keys, peer_id, set(self._streams))
        self._watched = self.audit.watched
        # The processed mark as Redis holds it, read with the state and moved by
        # each step committed: while this object is valid, this master is the
        # only writer, so it knows the mark without asking (see ``committed``).
        self.mark: str | None = None
        # The state version (scripts.COMMIT) the nodes hold now: the one loaded, moved
        # by every step built on them. A step names the version it was built from,
        # and Redis applies it only on that version, so a flow that fell behind
        # (another writer committed) is found at its next step, nothing written.
        # None for a flow not loaded from Redis (its steps are not checked).
        self.version: int | None = None
        # Where committed steps' outputs are counted per stream (the peer's metrics), or None.
        self.left: Counter | None = None
        # (node, state key, time) -> None: writes a history's "processing" entry (or an action's
        # attempt marker) to Redis before the handler it guards runs (the master's session sets
        # it; None: nothing is written).
        self.write_started = None
        self._journal: list[dict] = []  # this step's Duplicate and In Doubt verdicts
        # The action nodes that can suspend, and their suspensions as Redis holds them (the
        # state loaded holds them too): a step writes a suspension that began or ended.
        self._suspending = [node for node in graph.nodes.values() if getattr(node, "suspends", False)]
        self._suspensions = self.suspensions()
        for name, node in graph.nodes.items():
            if getattr(node, "external", False):
                node.started = lambda key, at, name=name: self._started(name, key, at)
            if getattr(node, "decide_doubt", None) is not None:  # an action a history guards (the engine wired it)
                node.attempt_started = lambda key, at, name=name: self._started(name, key, at)
            if hasattr(node, "journal"):
                node.journal = self._journal

    @classmethod
    def load(cls, graph: FlowGraph, store: FlowStore, deadline_s: float | None = None) -> "MasterFlow":
        """A new flow whose nodes continue from the state entries in Redis, with the processed mark."""
        with collector_paused():
            entries, mark, version = store.load_state_version([*graph.nodes, RESUBMITS], deadline_s=deadline_s)
            inflight = entries.pop(RESUBMITS)
            fresh = loaded_graph(graph, entries)
        return cls.resume(fresh, store, mark, version, inflight)

    @classmethod
    def resume(cls, graph: FlowGraph, store: FlowStore, mark: str | None, version: int,
               inflight: dict[str, Any] | None = None) -> "MasterFlow":
        """A flow on ``graph``'s nodes, which hold the state at ``version`` with the processed ``mark``
        (and ``inflight``: the resubmits the flow holds, as loaded, ``flow_audit.RESUBMITS``)."""
        flow = cls(graph, store.keys, store.peer_id)
        flow.mark, flow.version = mark, version
        flow.audit.load(inflight or {})
        return flow

    def committed(self, step: Step) -> None:
        """Record that ``step`` was committed: the mark moved to its own, if that is later."""
        if self.left is not None:  # one C-level pass per step (Counter over map), nothing per message in Python
            self.left.update(map(itemgetter(0), step.outputs))
        for entry in step.journal:  # the journal: one log event per Duplicate and In Doubt, once committed
            event(log, logging.INFO, "history_" + entry["status"], "history %s: message %r (uuid %r) is %s: %s",
                  entry["node"], entry["id"], entry["uuid"], entry["status"], entry["reason"],
                  flow=self.keys.flow, peer=self.peer_id, epoch=self._epoch, **entry)
        if step.mark and (self.mark is None or position_order(step.mark) > position_order(self.mark)):
            self.mark = step.mark

    def is_processed(self, msg: Message) -> bool:
        """At or before the processed mark: processed, whatever the ID cache says."""
        return self.mark is not None and position_order(msg.position) <= position_order(self.mark)

    # -- steps ------------------------------------------------------------
    def run(self, msgs: list[Message], now: float, epoch: int, mark: str | None = None) -> Step:
        """Run uplink messages (in uplink order, none processed before) through the flow at ``now``.

        ``mark`` is the last uplink position the step handled (default: the
        last message's). A second message with an ID already in this step is
        processed already: it is counted, not run. Any error a message raises in
        the flow raises :class:`MessageRefused` for it (this object is then
        unusable: its nodes hold part of that message).
        """
        step = self._begin(epoch)
        seen = set()
        for m in msgs:
            if m.id in seen:
                continue
            seen.add(m.id)
            step.ids.append(m.id)
            try:
                if m.__class__ is Resubmitted:
                    self._feed_resubmit(m, now)
                else:
                    self._bodies[m.id] = m
                    self.engine.feed(m.msg(), now)
            except (Fenced, RedisUnavailable):  # a "processing" entry could not be written: not the message's fault
                self._reset()
                raise
            except Exception as exc:  # noqa: BLE001 - bad input is data: one message never fails a batch
                self._reset()
                raise MessageRefused(m, f"the flow could not take this message: {type(exc).__name__}: {exc}"[:500]) from exc
        step.mark = mark if mark is not None else (msgs[-1].position if msgs else None)
        return self._end()

    def _feed_resubmit(self, m: Resubmitted, now: float) -> None:
        """A resubmitted message enters at the node it failed at ("" : the flow's input), under
        its original ID (runtime/resubmit.py); its outcome is recorded when it leaves."""
        node = m.node or self.graph.input
        if node not in self.graph.nodes:
            raise ValueError(f"the resubmit of audit entry {m.audit} names node {node!r}, "
                             f"which this flow's graph does not have")
        self.audit.fed(m)
        self.engine.feed_at(node, m.msg(), now, token=m.audit)

    def fire(self, now: float, epoch: int, resume: bool = False) -> Step:
        """Fire every deadline at or before ``now`` (no new message); with ``resume``, every
        suspended action node resumes at ``now`` first (``twinflow resume``)."""
        self._begin(epoch)
        if resume:
            for node in self._suspending:
                node.resume(now)
        self.engine.advance(now)
        return self._end()

    def suspensions(self) -> dict[str, dict]:
        """The suspended action nodes: name -> id, reason, since, until (see ActionNode.suspension)."""
        out = {}
        for node in self._suspending:
            s = node.suspension()
            if s is not None:
                out[node.name] = {k: s[k] for k in ("id", "reason", "since", "until")}
        return out

    def next_deadline(self) -> float | None:
        return self.engine.next_deadline()

    def pending(self) -> int:
        return sum(node.pending() for node in self.graph.nodes.values())

    def pending_nodes(self) -> dict[str, dict[str, Any]]:
        """What each node holds now: name -> its ``kind`` and its ``pending_counts()`` (``held`` first)."""
        return {name: {"kind": node.kind, **node.pending_counts()} for name, node in self.graph.nodes.items()}

    def _begin(self, epoch: int) -> Step:
        self._step, self._epoch = Step(version=self.version, logged=self.logged), epoch
        if self.version is not None:
            self.version += 1  # the nodes now hold the state this step makes
        return self._step

    def _reset(self) -> None:
        self._step = None
        self._bodies.clear()
        self._shared.clear()
        self._journal.clear()

    def _started(self, node: str, key: str, at: float) -> None:
        if self.write_started is not None:
            self.write_started(node, key, at)

    def _end(self) -> Step:
        step, self._step = self._step, None
        self._bodies.clear()
        self._shared.clear()
        step.journal = list(self._journal)
        self._journal.clear()
        if self._suspending:
            now = self.suspensions()
            if now != self._suspensions:
                for name in set(now) | set(self._suspensions):
                    if now.get(name) != self._suspensions.get(name):
                        step.suspended[name] = compact(now[name]) if name in now else None
                self._suspensions = now
        for name, node in self.graph.nodes.items():
            changed = node.changed_state()
            if changed:
                step.state[name] = changed
        inflight = self.audit.changed_state()
        if inflight:
            step.state[RESUBMITS] = inflight
        return step

    def _leave(self, node: str, e: Emit, at: float) -> None:
        # Every output's fields, in order: node, epoch, from, outlink, at (shared by the step's
        # outputs through one outlink at one time), then id and position/ids, data, info.
        if len(e.msgs) == 1:
            msg = e.msgs[0]
            original = self._bodies.get(msg.id)
            if original is not None and original.doc is msg.doc:
                names, values = _SINGLE_ORIGINAL, (msg.id, original.position, original.body)
            else:
                names, values = _SINGLE, (msg.id, compact(msg.doc))
        else:
            ids = [m.id for m in e.msgs]
            names = _GROUP
            values = ("+".join(ids), compact(ids), compact({"ids": ids, "messages": [dict(m.doc) for m in e.msgs]}))
        if e.info:
            names = names + ("info",)
            values = values + (json.dumps(dict(e.info), separators=(",", ":"), default=str),)
        shared = self._shared.get((node, e.outlink, at, names))
        if shared is None:
            shared = self._shared[(node, e.outlink, at, names)] = SharedFields(
                self._streams[(node, e.outlink)],
                ("node", self.peer_id, "epoch", self._epoch, "from", node, "outlink", e.outlink, "at", repr(at)),
                names)
        self._step.outputs.append((shared.stream, shared, values))
        if self.audit.inflight or (node, e.outlink) in self._watched:
            self.audit.left(self._step, self._epoch, node, e, at, values[names.index("data")], self._bodies)


_SINGLE_ORIGINAL = ("id", "position", "data")  # a message as it came: its uplink bytes
_SINGLE = ("id", "data")
_GROUP = ("id", "ids", "data")
