"""A ZooKeeper client with kazoo's interface over the simulator's :class:`~.zookeeper_model.ZkModel`.

:class:`SimKazooClient` is what ``cluster/leadership.py`` and ``cluster/membership.py``
are given in place of a ``KazooClient``: ``create`` (ephemeral, sequential,
``makepath``), ``ensure_path``, ``get``, ``exists`` and ``get_children`` with
watches, ``set``, ``delete`` (with versions), ``add_listener`` and
``remove_listener``, ``connected``, ``state``, ``client_id``, ``retry``,
``handler``, ``stop`` and ``close``, and kazoo's own recipes on it
(``Election``, ``Lock``, ``DataWatch``: kazoo's code, not copies), with kazoo's
states (``KazooState``) and exceptions.

What the client knows of its connection lags what happened, as a real one's
does: it notices (:meth:`SimKazooClient.notice`) when the simulator lets the
peer's ZooKeeper side act, or at its next call. Then a link that went down is
SUSPENDED; a link that is up again over a session that expired meanwhile is
LOST, then CONNECTED on a new session (as kazoo reconnects); a link up again
within the session is CONNECTED. Listeners are called as kazoo calls them, in
the thread that noticed. A call while the link is down raises ``ConnectionLoss``
(kazoo's recipes and ``leadership.py`` retry it; a real call would wait for the
connection, which ``leadership.py`` never relies on). Watches run on the
client's event thread, one at a time, when it gets a turn (``turns.py``).

kazoo's retry sleeps its back-off with random jitter; here each sleep is
:data:`RETRY_SLEEP_S` of virtual time whatever it asked for, so that a seed
replays one order.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from typing import Callable

from kazoo.exceptions import ConnectionClosedError, ConnectionLoss
from kazoo.protocol.states import KazooState, WatchedEvent, ZnodeStat
from kazoo.recipe.election import Election
from kazoo.recipe.lock import Lock
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry

from .turns import PeerThreads, SimEvent, SimLock, SimThread, ThreadKilled
from .zookeeper_model import Session, Watcher, ZkModel

log = logging.getLogger("twinflow.sim")

RETRY_SLEEP_S = 0.1


class _Handler:
    """kazoo's handler interface (what its recipes make events, locks and threads with)."""

    def __init__(self, threads: PeerThreads):
        self.threads = threads

    def event_object(self) -> SimEvent:
        return self.threads.Event()

    def lock_object(self) -> SimLock:
        return self.threads.Lock()

    def rlock_object(self) -> SimLock:
        return self.threads.Lock()  # kazoo's recipes used here never take one twice

    def sleep_func(self, seconds: float) -> None:
        self.threads.sleep(RETRY_SLEEP_S)

    def spawn(self, func: Callable[..., None], *args, **kwargs) -> SimThread:
        return self.threads.spawn(func, *args, **kwargs)


class SimKazooClient:
    """One process's ZooKeeper client (see the module doc). ``link_up()``: this process runs and
    reaches ZooKeeper now; ``threads``: the process's threads (its event thread among them)."""

    def __init__(self, model: ZkModel, peer_id: str, link_up: Callable[[], bool], threads: PeerThreads):
        self.model, self.peer_id, self.link_up, self.threads = model, peer_id, link_up, threads
        self.handler = _Handler(threads)
        self.retry = KazooRetry(max_tries=-1, sleep_func=self.handler.sleep_func)
        self.default_acl = None
        self.state = KazooState.CONNECTED
        self.closed = False
        self._listeners: list[Callable[[str], object]] = []
        self._events: deque[tuple[Watcher, WatchedEvent]] = deque()
        self.session = self._open()
        self.sessions_lost = 0
        self.Election = functools.partial(Election, self)
        self.Lock = functools.partial(Lock, self)
        self.DataWatch = functools.partial(DataWatch, self)
        events = threads.Thread(self._event_loop, "zk-events")
        events.start()

    def _open(self) -> Session:
        return self.model.open_session(self.peer_id, self.link_up, self._deliver)

    # -- the connection, as the client sees it ----------------------------------
    @property
    def connected(self) -> bool:
        return self.state == KazooState.CONNECTED

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        return (self.session.sid, b"") if self.connected else None

    def add_listener(self, listener: Callable[[str], object]) -> None:
        if listener not in self._listeners:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], object]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def behind(self) -> bool:
        """Whether :meth:`notice` would change what the client knows."""
        if self.closed:
            return False
        if not self.link_up():
            return self.connected
        return not self.connected or not self.model.alive(self.session.sid)

    def notice(self) -> None:
        """What kazoo's connection thread does: notice the link going down (SUSPENDED), coming back
        (CONNECTED) or coming back to an expired session (LOST, then CONNECTED on a new one)."""
        if self.closed:
            return
        if not self.link_up():
            if self.connected:
                self._change(KazooState.SUSPENDED)
            return
        if not self.model.alive(self.session.sid):
            self.sessions_lost += 1
            self._change(KazooState.LOST)
            self._events.clear()  # a lost session's watches are gone with it
            self.session = self._open()
            self._change(KazooState.CONNECTED)
        elif not self.connected:
            self._change(KazooState.CONNECTED)

    def _change(self, state: str) -> None:
        self.state = state
        for listener in list(self._listeners):
            try:
                if listener(state) is True:  # kazoo drops a listener that returns True
                    self.remove_listener(listener)
            except (ThreadKilled, ConnectionClosedError):
                raise
            except Exception:
                log.exception("a ZooKeeper listener raised")

    # -- watches: the event thread ---------------------------------------------
    def _deliver(self, watch: Watcher, event: WatchedEvent) -> None:
        self._events.append((watch, event))

    def _event_loop(self) -> None:
        while True:
            self.threads.turns.wait_for(lambda: bool(self._events) and self.connected, None)
            watch, event = self._events.popleft()
            try:
                watch(event)
            except Exception:  # kazoo logs a watcher's error and goes on
                log.exception("a ZooKeeper watch raised")

    # -- calls ---------------------------------------------------------------------
    def _session(self) -> int:
        if self.threads.killed:
            raise ThreadKilled(self.peer_id)
        if self.closed:
            raise ConnectionClosedError("Connection has been closed")
        self.notice()
        if not self.connected:
            raise ConnectionLoss(f"simulated: {self.peer_id} cannot reach ZooKeeper")
        return self.session.sid

    def create(self, path: str, value: bytes = b"", acl=None, ephemeral: bool = False, sequence: bool = False,
               makepath: bool = False, include_data: bool = False) -> str:
        sid = self._session()
        return self.model.create(sid, path, value, ephemeral, sequence, makepath)

    def ensure_path(self, path: str, acl=None) -> bool:
        self._session()
        self.model.ensure(path)
        return True

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, ZnodeStat]:
        return self.model.get(self._session(), path, watch)

    def exists(self, path: str, watch: Watcher | None = None) -> ZnodeStat | None:
        return self.model.exists(self._session(), path, watch)

    def get_children(self, path: str, watch: Watcher | None = None, include_data: bool = False) -> list[str]:
        return self.model.get_children(self._session(), path, watch)

    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat:
        self._session()
        return self.model.set(path, value, version)

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        self._session()
        self.model.delete(path, version)
        return True

    def stop(self) -> None:
        """Close the session (its ephemeral znodes go at once), if ZooKeeper can be reached."""
        if self.closed:
            return
        if self.link_up() and self.model.alive(self.session.sid):
            self.model.close_session(self.session.sid)
        self.closed = True
        self._change(KazooState.LOST)

    def close(self) -> None:
        self.closed = True
