"""What a peer and its members are built from: their collaborators, passed in rather than built inside.

A :class:`~twinflow.cluster.peer.Peer` (one ``twinflow run`` process) asks
its :class:`PeerParts` for the flow's clock, which all its members share
(``Peer.for_flow``, unless it is given one; None: the wall clock), then at
start, in this order, for its ZooKeeper session, its uplink engine (the
JVM), its gRPC server and, last, its uplink reading (one query for all its
members). Each
:class:`~twinflow.cluster.member.FlowMember` (the peer's part in one flow,
or one shard of it) asks its :class:`MemberParts` for its Redis store, its
escalation sender, its leadership, its timers, where its master's COMMITs
are sent from (``writes``) and where its master's batches run ahead of
Spark (``batches_ahead``, or None).

:class:`~twinflow.cluster.real_parts.RealParts` fills both with real
servers and Spark; a test or the failover simulator passes its own (an
in-memory reading that calls ``member.on_batch``, a store on a private
Redis, the real leadership on a ZooKeeper model with threads that take turns,
a virtual clock) and drives the same peer and member logic without Spark or
ZooKeeper.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

from ..runtime.clock import Clock
from ..runtime.flowgraph import FlowGraph
from ..runtime.store.flow_store import FlowStore
from .escalation import EscalationSender
from .leadership import Leadership
from .peer_config import PeerConfig

if TYPE_CHECKING:
    from .member import FlowMember
    from .peer import Peer


class UplinkReading(Protocol):
    """The running reader of a peer's uplink(s) that calls its members' batches (Spark's query, or a fake)."""

    @property
    def isActive(self) -> bool: ...  # noqa: N802  (Spark's name)

    def exception(self) -> Any: ...
    def hold(self, member: "FlowMember", held: bool) -> None: ...
    def pace(self, member: "FlowMember", interval_ms: int, behind_ms: int = 0) -> None: ...
    def stop(self) -> None: ...


class MemberParts(Protocol):
    def store(self, member: "FlowMember") -> FlowStore: ...
    def sender(self, member: "FlowMember") -> EscalationSender: ...
    def leadership(self, member: "FlowMember") -> Leadership: ...
    def start_timers(self, member: "FlowMember") -> None: ...
    def writes(self) -> Executor: ...
    def batches_ahead(self) -> Executor | None: ...


class PeerParts(Protocol):
    def clock(self, graph: FlowGraph, config: PeerConfig) -> Clock | None: ...
    def zookeeper(self, peer: "Peer") -> Any: ...
    def engine(self, peer: "Peer") -> None: ...
    def server(self, peer: "Peer") -> tuple[Any, int]: ...
    def reading(self, peer: "Peer", starts: list[dict]) -> UplinkReading: ...
    def close(self) -> None: ...
