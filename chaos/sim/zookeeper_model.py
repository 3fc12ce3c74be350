"""ZooKeeper and the election for the simulator: sessions, ephemeral znodes, a fair lock queue
and the epoch znode's version, on the virtual clock.

:class:`ZkModel` keeps what the ZooKeeper ensemble keeps for one flow:

- sessions: a session lives while its client is heard from; a client that
  is paused, killed or cut off is not, and its session expires
  ``session_timeout`` seconds after it was last heard from. Expiry deletes
  the session's ephemeral znodes (its member znode, its place in the queue);
- the election queue (kazoo's Election recipe, a fair lock): contenders in
  the order they queued; the first one holds the lock;
- the epoch: the version of ``/twinflow/<flow>/epoch``, raised by one at
  every promotion, never repeated.

:class:`SimLeadership` is one peer's side, with the interface and the
promises of :class:`twinflow.cluster.leadership.Leadership` (see its module
doc): ``on_promoted(epoch)`` and ``on_demoted(reason)`` one at a time, every
promotion followed by exactly one demotion, suspended once it notices the
link is cut, demoted once it notices its session is lost, queueing again
only while ``may_contend()``. Where the real class reacts on kazoo's
threads, this one reacts when the simulator calls
:meth:`SimLeadership.react`, so the simulator decides when a peer notices
what ZooKeeper did: a master may go on writing for a while after its
session expired (paused, cut off), and fencing in Redis must refuse it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

from ...cluster import membership as _membership

# Where the real class raises MembersUnknown while ZooKeeper cannot list the members, so does
# this one (with an older Leadership, which answered {}, it answers {} too).
_MembersUnknown = getattr(_membership, "MembersUnknown", None)


@dataclass
class Session:
    sid: int
    peer_id: str
    heard: Callable[[], bool]     # whether the client is heard from now
    last_heard: float
    expired: bool = False


@dataclass(frozen=True)
class Stat:
    version: int


class ZkModel:
    def __init__(self, now: Callable[[], float], session_timeout: float):
        self.now = now
        self.session_timeout = session_timeout
        self.sessions: dict[int, Session] = {}
        self.members: dict[str, tuple[str, int]] = {}    # peer_id -> (address, session)
        self.queue: list[tuple[str, int]] = []             # (peer_id, session), lock holder first
        self.epoch = 0
        self.epoch_owner: str | None = None  # the peer that wrote the epoch znode last
        self._sids = itertools.count(1)

    def open_session(self, peer_id: str, heard: Callable[[], bool]) -> Session:
        s = Session(next(self._sids), peer_id, heard, self.now())
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
                s.expired = True
                gone.append(s)
        for s in gone:
            self._drop_ephemerals(s.sid)
        return gone

    def close_session(self, sid: int) -> None:
        s = self.sessions.get(sid)
        if s is not None and not s.expired:
            s.expired = True
            self._drop_ephemerals(sid)

    def _drop_ephemerals(self, sid: int) -> None:
        self.members = {n: v for n, v in self.members.items() if v[1] != sid}
        self.queue = [q for q in self.queue if q[1] != sid]

    def alive(self, sid: int) -> bool:
        s = self.sessions.get(sid)
        return s is not None and not s.expired

    def next_epoch(self, peer_id: str = "") -> int:
        """Write the epoch znode as ``peer_id``: its version is the new epoch."""
        self.epoch += 1
        self.epoch_owner = peer_id or None
        return self.epoch

    def leader(self) -> str | None:
        return self.queue[0][0] if self.queue else None


class SimZkClient:
    """What FlowMember itself asks ZooKeeper (the epoch znode), and stop/close."""

    def __init__(self, model: ZkModel):
        self.model = model

    def exists(self, path: str) -> Stat | None:
        return Stat(self.model.epoch) if path.endswith("/epoch") else None

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


class SimLeadership:
    def __init__(self, model: ZkModel, peer_id: str, address: str, on_promoted: Callable[[int], None],
                 on_demoted: Callable[[str], None], may_contend: Callable[[], bool],
                 connected: Callable[[], bool], say: Callable[[str], None]):
        self.model = model
        self.peer_id = peer_id
        self.address = address
        self._on_promoted = on_promoted
        self._on_demoted = on_demoted
        self._may_contend = may_contend
        self._connected = connected     # the peer's link to ZooKeeper is up and the peer runs
        self._say = say
        self.session: Session | None = None
        self.epoch = 0
        self._master = False
        self._demote: str | None = None
        self._stopped = False
        # What the peer's kazoo client knows, which lags what happened: a connection drop
        # (SUSPENDED) or a session expiry (LOST) is noticed only when react() runs.
        self._seen_down = False

    # -- Leadership's interface -------------------------------------------
    def start(self) -> None:
        self.session = self.model.open_session(self.peer_id, self._connected)
        self._register()

    @property
    def is_master(self) -> bool:
        return self._master

    @property
    def suspended(self) -> bool:
        return self._seen_down

    def may_write(self) -> bool:
        # As in the real class: from what the client has noticed so far, which may be stale
        # (a resumed or cut-off master writes until it notices; fencing must refuse it).
        return self._master and not self._seen_down

    def current_master(self, fresh: bool = False) -> tuple[str | None, int]:
        # The real class's watch may lag; the model's answer is always the znode as it is.
        return self.model.epoch_owner, self.model.epoch

    def members(self) -> dict[str, str]:
        if not self._connected():  # the real call fails while the connection is down
            if _MembersUnknown is not None:
                raise _MembersUnknown(f"simulated: {self.peer_id} cannot reach ZooKeeper")
            return {}
        return {n: addr for n, (addr, _) in self.model.members.items()}

    def step_down(self, reason: str) -> None:
        if self._master and self._demote is None:
            self._demote = reason

    def handover(self, timeout_s: float) -> dict:
        return {"ok": False, "reason": "not simulated"}

    def stop(self) -> None:
        self._stopped = True
        if self._master:
            self._end_role("stopping")
        if self.session is not None and not self.suspended:
            self.model.close_session(self.session.sid)

    # -- what kazoo's threads do in the real class ---------------------------
    def pending(self) -> bool:
        """Whether :meth:`react` has anything to do now."""
        if self._stopped:
            return False
        if not self._connected():
            return not self._seen_down
        if self._seen_down:
            return True
        s = self.session
        if s is None or s.expired or self._demote is not None:
            return True
        queued = any(q == (self.peer_id, s.sid) for q in self.model.queue)
        if not queued:
            return not self._master and self._gate()
        return self.model.queue[0] == (self.peer_id, s.sid) and not self._master

    def react(self) -> None:
        """One pass of the election loop: notice a lost session, finish a step-down,
        queue, or take the lock at the head of the queue."""
        if self._stopped:
            return
        if not self._connected():
            self._seen_down = True  # SUSPENDED: stop writing, keep the role
            return
        self._seen_down = False
        s = self.session
        if s is None or s.expired:
            if self._master:
                self._end_role("session lost")
            self.session = self.model.open_session(self.peer_id, self._connected)
            self._register()
            return
        if self._demote is not None:
            self._end_role(self._demote)
            return
        me = (self.peer_id, s.sid)
        if me not in self.model.queue:
            if not self._master and self._gate():
                self.model.queue.append(me)
                self._say(f"{self.peer_id} queues for the election")
            return
        if self.model.queue[0] == me and not self._master:
            epoch = self.model.next_epoch(self.peer_id)
            self.epoch, self._master, self._demote = epoch, True, None
            self._say(f"{self.peer_id} promoted, epoch {epoch}")
            try:
                self._on_promoted(epoch)
            except Exception as exc:
                self._end_role(f"promotion failed: {type(exc).__name__}: {exc}")

    def notice_connection(self) -> None:
        """What kazoo's event thread does while a batch waits: notice the connection coming
        back or going, and a lost session (which demotes a master); never promote."""
        if self._stopped:
            return
        if not self._connected():
            self._seen_down = True
            return
        self._seen_down = False
        if self._master and not self.model.alive(self.session.sid):
            self._end_role("session lost")

    def _end_role(self, reason: str) -> None:
        self._master, self._demote = False, None
        s = self.session
        if s is not None:  # release the lock (a lost session already did)
            self.model.queue = [q for q in self.model.queue if q != (self.peer_id, s.sid)]
        self._say(f"{self.peer_id} demoted ({reason}), epoch {self.epoch}")
        self._on_demoted(reason)

    def _gate(self) -> bool:
        try:
            return bool(self._may_contend())
        except Exception:
            return False

    def _register(self) -> None:
        self.model.members[self.peer_id] = (self.address, self.session.sid)
