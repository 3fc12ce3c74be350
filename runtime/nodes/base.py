"""What every node is: pure logic that takes messages and time, and says what leaves where.

A node never reads a clock, sleeps, or touches a server. The engine (replay,
or the Spark driver) calls ``on_message(msg, now)`` for each message and
``on_time(now)`` whenever ``now`` reaches ``next_deadline()``; both return
the emissions that leave the node, in order. Every message that enters a
node leaves it exactly once, through one outlink (alone, or inside a group
emission such as a join or an aggregation), unless the node documents that it
holds it until a later call.

State per key. A node that holds anything between calls keeps it as
entries, each under a text key (an activation, a group, a history
identifier), and says which entries changed: ``changed_state()`` returns
every entry changed since the last call as key -> a JSON value, or None for
an entry that is gone, and ``load_state(entries)`` makes a new node continue
from the entries. The engine of a cluster master writes the changes to Redis
in the same fenced step as the batch's outputs, and a newly promoted master
loads them, so it carries on with exactly the state the old one left
(DESIGN.md, "Node state"). Replay never calls either; a node that keeps no
state inherits both as no-ops. ``STATEFUL`` nodes that do not implement them
are refused by ``twinflow run``.

>>> class Echo(Node):
...     kind, outlinks = "echo", ("out",)
...     def on_message(self, msg, now):
...         return [Emit("out", (msg,))]
>>> Echo("e").on_message(Msg("m1", {"id": "m1"}), now=0.0)[0].outlink
'out'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator


class _NoInfo(Mapping):
    """The shared, immutable, empty ``info`` of most emissions (hashable, so it can be a default)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"


NO_INFO: Mapping[str, Any] = _NoInfo()


@dataclass(slots=True)  # not frozen: a frozen dataclass's constructor costs about 1 µs more (measured)
class Msg:
    """One message: its ID and its JSON document (both read-only by convention)."""

    id: str
    doc: Mapping[str, Any]


@dataclass(slots=True)
class Emit:
    """One emission: messages leaving a node through one outlink, with optional details.

    ``msgs`` holds one message, or several when one emission carries a group
    (a join, an aggregation). ``info`` carries what the outlink means for
    these messages: a failure reason, the incomplete recipients of a timed-out
    aggregation, an assigned sequence number.
    """

    outlink: str
    msgs: tuple[Msg, ...]
    # Not frozen, and no per-emission dict: building an Emit is on every
    # node's hot path (a frozen dataclass with a dict factory cost 3x as much).
    info: Mapping[str, Any] = NO_INFO


class Node(ABC):
    """Base class of every node; see the module docstring for the contract."""

    kind: ClassVar[str]
    outlinks: ClassVar[tuple[str, ...]]

    def __init__(self, name: str):
        self.name = name

    @abstractmethod
    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        """Take one message at time ``now``; return what leaves, in order."""

    def on_time(self, now: float) -> list[Emit]:
        """Fire every deadline at or before ``now``; return what leaves, in order."""
        return []

    def next_deadline(self) -> float | None:
        """The earliest time at which ``on_time`` has work (an emission or a state change), or None."""
        return None

    # Whether every deadline the node sets while it takes a message at time t is later than t
    # (a time-out > 0 from t): then an engine that fired every deadline up to t need not ask
    # again before the next message at t (engine.py). False, the safe answer, unless a node
    # knows better.
    sets_deadlines_after_now: bool = False

    def pending(self) -> int:
        """How many messages the node holds now."""
        return 0

    def pending_counts(self) -> dict[str, Any]:
        """What the node holds now, for a peer's status (``pending_nodes``): ``held``, the messages
        (as :meth:`pending`), and more counts where the node keeps them (its groups, its retries).
        Cheap: counted, never walked message by message."""
        return {"held": self.pending()}

    # Whether the node implements changed_state/load_state (False: it holds
    # state between calls that only lives in this process, so it runs in replay only).
    state_in_redis: ClassVar[bool] = True

    def changed_state(self) -> dict[str, Any]:
        """Every state entry changed since the last call: key -> JSON value, or None when gone
        (an entry made and gone again since the last call may be left out: nothing stored it)."""
        return {}

    # Whether the flow's change log carries this node's state changes, so that a worker can keep
    # a copy of it warm (cluster/warm_state.py): for state that grows with the traffic.
    logs_state_changes: bool = False

    def apply_state(self, changes: Mapping[str, Any]) -> None:
        """Apply one step's ``changed_state`` (key -> value, None: gone) to the state loaded, as
        that step's master made it; only for nodes that log their state changes."""
        raise NotImplementedError(f"{self.kind} node {self.name!r} does not log its state changes")

    def load_state(self, entries: Mapping[str, Any]) -> None:
        """Continue from ``entries`` (what ``changed_state`` said, accumulated); the node must be new."""
        if entries:
            raise ValueError(f"{self.kind} node {self.name!r} keeps no state but was given {len(entries)} entries")


def msg_json(msg: Msg) -> list:
    """A message as a state entry holds it."""
    return [msg.id, msg.doc]


def msg_from_json(value: list) -> Msg:
    return Msg(value[0], value[1])
