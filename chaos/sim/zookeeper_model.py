"""ZooKeeper for the simulator: znodes, sessions and watches, on the virtual clock.

:class:`ZkModel` keeps what a ZooKeeper ensemble keeps:

- znodes: a tree of paths with data, a data version, a child version and the
  zxids of their creation and last change; ephemeral ones belong to a session;
  sequential ones get their parent's next ten-digit number;
- sessions: a session lives while its client is heard from; a client that is
  paused, killed or cut off is not, and its session expires
  ``session_timeout`` seconds after it was last heard from. Expiry (or a
  client's close) deletes the session's ephemeral znodes and drops its
  watches;
- watches, one-shot as ZooKeeper's: a data watch (``get``, ``exists``) fires
  once at the znode's next change, creation or deletion, a child watch
  (``get_children``) at its next child created or deleted. A watch is
  handed to the client that set it (``kazoo_model.SimKazooClient``), whose
  event thread runs it when it gets a turn.

It answers operations and raises kazoo's own exceptions (``kazoo.exceptions``)
as a server would; what a client sees of its connection is the client's
(``kazoo_model.py``). :meth:`ZkModel.epoch` and :meth:`ZkModel.leader` read a
flow's epoch znode and election queue for the simulator's trace and checks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

from kazoo.exceptions import BadVersionError, NoNodeError, NodeExistsError, NotEmptyError
from kazoo.protocol.states import EventType, KeeperState, WatchedEvent, ZnodeStat

Watcher = Callable[[WatchedEvent], None]


@dataclass
class Session:
    sid: int
    peer_id: str
    heard: Callable[[], bool]     # whether the client is heard from now
    last_heard: float
    expired: bool = False
    deliver: Callable[[Watcher, WatchedEvent], None] = lambda w, e: None  # to the client's event thread


@dataclass
class Znode:
    data: bytes
    czxid: int
    mzxid: int
    ctime: float
    owner: int = 0                # the session of an ephemeral znode (0: persistent)
    version: int = 0
    cversion: int = 0
    sequence: int = 0             # the next sequential child's number
    children: list[str] = field(default_factory=list)   # in the order they were created


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class ZkModel:
    def __init__(self, now: Callable[[], float], session_timeout: float):
        self.now = now
        self.session_timeout = session_timeout
        self.sessions: dict[int, Session] = {}
        self.nodes: dict[str, Znode] = {"/": Znode(b"", 0, 0, 0.0)}
        self._zxid = itertools.count(1)
        self._sids = itertools.count(0x1000)
        self._data_watches: dict[str, list[tuple[int, Watcher]]] = {}
        self._child_watches: dict[str, list[tuple[int, Watcher]]] = {}

    # -- sessions -----------------------------------------------------------
    def open_session(self, peer_id: str, heard: Callable[[], bool],
                     deliver: Callable[[Watcher, WatchedEvent], None]) -> Session:
        s = Session(next(self._sids), peer_id, heard, self.now(), deliver=deliver)
        self.sessions[s.sid] = s
        return s

    def expire_due(self) -> list[Session]:
        """Expire every session not heard from for longer than the time-out; returns them."""
        now, gone = self.now(), []
        for s in self.sessions.values():
            if s.expired:
                continue
            if s.heard():
                s.last_heard = now
            elif now - s.last_heard > self.session_timeout:
                gone.append(s)
        for s in gone:
            self.close_session(s.sid)
        return gone

    def close_session(self, sid: int) -> None:
        s = self.sessions.get(sid)
        if s is None or s.expired:
            return
        s.expired = True
        for watches in (*self._data_watches.values(), *self._child_watches.values()):
            watches[:] = [w for w in watches if w[0] != sid]
        for path in [p for p, n in self.nodes.items() if n.owner == sid]:
            if path in self.nodes:
                self._remove(path)

    def alive(self, sid: int) -> bool:
        s = self.sessions.get(sid)
        return s is not None and not s.expired

    # -- operations (of a live session) ---------------------------------------
    def create(self, sid: int, path: str, data: bytes, ephemeral: bool, sequence: bool, makepath: bool) -> str:
        parent = _parent(path)
        if parent not in self.nodes:
            if not makepath:
                raise NoNodeError(path)
            self.ensure(parent)
        p = self.nodes[parent]
        if p.owner:
            raise NoNodeError(f"{parent} is ephemeral: no children")  # ZooKeeper: NoChildrenForEphemerals
        if sequence:
            path = f"{path}{p.sequence:010d}"
            p.sequence += 1
        if path in self.nodes:
            raise NodeExistsError(path)
        zxid = next(self._zxid)
        self.nodes[path] = Znode(bytes(data), zxid, zxid, self.now(), owner=sid if ephemeral else 0)
        p.children.append(path.rsplit("/", 1)[1])
        p.cversion += 1
        self._fire(self._data_watches, path, EventType.CREATED)
        self._fire(self._child_watches, parent, EventType.CHILD)
        return path

    def ensure(self, path: str) -> None:
        """Make ``path`` and its parents exist (persistent, empty)."""
        if path in self.nodes:
            return
        self.ensure(_parent(path))
        try:
            self.create(0, path, b"", False, False, False)
        except NodeExistsError:
            pass

    def get(self, sid: int, path: str, watch: Watcher | None) -> tuple[bytes, ZnodeStat]:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        if watch is not None:
            self._data_watches.setdefault(path, []).append((sid, watch))
        return node.data, self.stat(path)

    def exists(self, sid: int, path: str, watch: Watcher | None) -> ZnodeStat | None:
        if watch is not None:
            self._data_watches.setdefault(path, []).append((sid, watch))
        return self.stat(path) if path in self.nodes else None

    def get_children(self, sid: int, path: str, watch: Watcher | None) -> list[str]:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        if watch is not None:
            self._child_watches.setdefault(path, []).append((sid, watch))
        return list(node.children)

    def set(self, path: str, data: bytes, version: int) -> ZnodeStat:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        if version != -1 and version != node.version:
            raise BadVersionError(path)
        node.data, node.version, node.mzxid = bytes(data), node.version + 1, next(self._zxid)
        self._fire(self._data_watches, path, EventType.CHANGED)
        return self.stat(path)

    def delete(self, path: str, version: int) -> None:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        if version != -1 and version != node.version:
            raise BadVersionError(path)
        if node.children:
            raise NotEmptyError(path)
        self._remove(path)

    def stat(self, path: str) -> ZnodeStat:
        n = self.nodes[path]
        return ZnodeStat(n.czxid, n.mzxid, n.ctime, n.ctime, n.version, n.cversion, 0, n.owner, len(n.data),
                         len(n.children), n.mzxid)

    def _remove(self, path: str) -> None:
        del self.nodes[path]
        parent = _parent(path)
        p = self.nodes.get(parent)
        if p is not None:
            p.children.remove(path.rsplit("/", 1)[1])
            p.cversion += 1
        self._fire(self._data_watches, path, EventType.DELETED)
        self._fire(self._child_watches, path, EventType.DELETED)
        self._fire(self._child_watches, parent, EventType.CHILD)

    def _fire(self, table: dict[str, list[tuple[int, Watcher]]], path: str, kind: str) -> None:
        watches = table.pop(path, [])
        for sid, watch in watches:
            s = self.sessions.get(sid)
            if s is not None and not s.expired:
                s.deliver(watch, WatchedEvent(kind, KeeperState.CONNECTED, path))

    # -- what the simulator reads ---------------------------------------------
    def epoch(self, root: str) -> tuple[int, str | None]:
        """The flow's epoch (its epoch znode's version) and the peer that wrote it last."""
        node = self.nodes.get(f"{root}/epoch")
        if node is None:
            return 0, None
        return node.version, node.data.decode() or None

    def contenders(self, root: str) -> list[tuple[str, int]]:
        """The flow's election queue: (peer, session) of each contender, the lock holder first."""
        node = self.nodes.get(f"{root}/election")
        if node is None:
            return []
        names = sorted(node.children, key=lambda c: c[-10:])
        return [(self.nodes[f"{root}/election/{c}"].data.decode(), self.nodes[f"{root}/election/{c}"].owner)
                for c in names]

    def leader(self, root: str) -> str | None:
        queue = self.contenders(root)
        return queue[0][0] if queue else None
