"""What every node is: pure logic that takes messages and time, and says what leaves where.

A node never reads a clock, sleeps, or touches a server. The engine (replay,
or the Spark driver) calls ``on_message(msg, now)`` for each message and
``on_time(now)`` whenever ``now`` reaches ``next_deadline()``; both return
the emissions that leave the node, in order. Every message that enters a
node leaves it exactly once, through one outlink (alone, or inside a group
emission such as a join or an aggregation), unless the node documents that it
holds it until a later call.

>>> class Echo(Node):
...     kind, outlinks = "echo", ("out",)
...     def on_message(self, msg, now):
...         return [Emit("out", (msg,))]
>>> Echo("e").on_message(Msg("m1", {"id": "m1"}), now=0.0)[0].outlink
'out'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping


@dataclass(frozen=True, slots=True)
class Msg:
    """One message: its ID and its JSON document (read-only by convention)."""

    id: str
    doc: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Emit:
    """One emission: messages leaving a node through one outlink, with optional details.

    ``msgs`` holds one message, or several when one emission carries a group
    (a join, an aggregation). ``info`` carries what the outlink means for
    these messages: a failure reason, the incomplete recipients of a timed-out
    aggregation, an assigned sequence number.
    """

    outlink: str
    msgs: tuple[Msg, ...]
    info: Mapping[str, Any] = field(default_factory=dict)


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
        """The earliest time at which ``on_time`` would emit something, or None."""
        return None

    def pending(self) -> int:
        """How many messages the node holds now."""
        return 0
