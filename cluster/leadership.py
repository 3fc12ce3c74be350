"""Who is master: ZooKeeper election, epochs and membership for one flow.

Layout under ``/twinflow/<flow>``: ``election`` (kazoo's Election recipe),
``epoch`` (its data version is the epoch: every promotion sets it once, so
epochs grow by one per promotion and never repeat), and ``members/<peer>``
(ephemeral, the peer's gRPC address). With ZooKeeper credentials
(``cluster/zk_auth.py``) the flow's znodes carry an ACL for that identity
only; ``start()`` gives the ACL to ones created without it, and raises
``ZkAccessDenied`` naming the path when ZooKeeper refuses this peer. The
member znode and the flow's znodes are kept by :class:`~.membership.Membership`
(``membership.py``), which :class:`Leadership` is built on.

What happens on each connection state (kazoo ``KazooState``):

- SUSPENDED: the connection dropped; the session may still be alive. The
  master stops writing (``may_write()`` is False) until it is CONNECTED
  again; it keeps the role, because the session and the lock may survive.
- LOST: the session expired, so the lock is gone and another peer may be
  master already. ``on_demoted("session lost")`` runs; once a new session is
  up the peer registers again and queues for the election as a worker
  (once ``may_contend()`` allows).
- CONNECTED: writing resumes if the peer still holds the lock.

A stale master that misses all of this (paused, partitioned) cannot do harm:
its Redis writes carry its old epoch and are refused (fencing).

Its threads, events, locks and time come from ``threads`` (:class:`Threads`: the
standard library's and the wall clock, unless a simulator passes threads that take
turns on a virtual clock, ``chaos/sim/turns.py``); what it asks ZooKeeper goes through
``zk``, a kazoo client or one with kazoo's interface. ``clock`` (the flow's clock, a
member's ``clock.now``) dates ``elected_at``, so that it compares with the times the
member records; ``on_event(name, fields)`` is told each operator event it logs (a member
queues the ones its timeline shows; it must not wait, as it runs on kazoo's event thread).

``on_promoted(epoch)`` and ``on_demoted(reason)`` run on the election thread,
one at a time, never concurrently with each other. Every ``on_promoted`` is
followed by exactly one ``on_demoted``, also when ``on_promoted`` raised
(reason ``"promotion failed: <error>"``).

Promises under failure:

- Members list complete, so no message is left unclaimed (``membership.py``).
- Election survives, so there is always a master candidate: whatever the
  election loop meets (a ZooKeeper error while queued, an exception from
  ``on_promoted``, ``on_demoted`` or the epoch update), it logs it with the
  traceback, makes sure the peer is demoted (``is_master`` False,
  ``on_demoted`` called once if ``on_promoted`` was), waits about 0.2 s and
  queues again. Only ``stop()`` ends it. A contender node that a failed
  release left behind in the peer's own session is removed before queueing,
  so it cannot block the queue.
- Contending only when able: the peer queues only while ``may_contend()``
  returns True (polled about every 0.1 s otherwise; an exception counts as
  False), so a peer joins once it can do the master's work (its stream is
  warm, Redis answers) and re-joins after a step-down only once it can again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NoNodeError

from ..logs import event
from .membership import RETRY_PAUSE_S, Membership
from .zk_auth import ZkAccessDenied, identity_of
from .zk_paths import ZkPaths

log = logging.getLogger("twinflow.leadership")

GATE_POLL_S = 0.1      # how often a closed may_contend gate is asked again


class Threads:
    """Where a :class:`Leadership` gets its threads, events, locks and time: the standard
    library's and the wall clock. A simulator passes its own, with the same names and calls,
    so that the same election code runs one thread at a time on its clock."""

    Thread = threading.Thread
    Event = threading.Event
    Lock = threading.Lock
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


class Leadership(Membership):
    def __init__(
        self,
        zk: KazooClient,
        flow: str,
        peer_id: str,
        address: str,
        on_promoted: Callable[[int], None],
        on_demoted: Callable[[str], None],
        *,
        may_contend: Callable[[], bool] = lambda: True,
        threads: Threads | None = None,
        clock: Callable[[], float] = time.time,
        on_event: Callable[[str, dict], None] | None = None,
    ):
        self._threads = t = threads or Threads()
        self._clock = clock
        self._on_event = on_event
        self.zk = zk
        self.flow = flow
        self.peer_id = peer_id
        self.address = address
        self.paths = ZkPaths(flow)
        self._member_path = self.paths.member(peer_id)
        self._member_data = json.dumps({"address": address}).encode()
        self._on_promoted = on_promoted
        self._on_demoted = on_demoted
        self._may_contend = may_contend
        self.epoch = 0
        # When this peer's election last granted it the lock (``clock``): the old master's session
        # expired, or it let go (a handover); and the master ZooKeeper named before it then (None:
        # none yet). A promotion's record dates its phases from these.
        self.elected_at: float | None = None
        self.previous_master: str | None = None
        self._master = t.Event()
        self._suspended = t.Event()
        self._suspended_at = 0.0               # monotonic time the connection dropped (for the log)
        self._new_session = False              # the session was lost since the connection dropped (for the log)
        self._demote = t.Event()
        self._demote_reason = ""
        self._stopping = t.Event()
        self._session_lost = t.Event()
        self._losses = 0                       # sessions lost so far (set on kazoo's event thread)
        self.disconnects = 0                   # connection drops so far, for the metrics (event thread)
        self._member_check = t.Event()  # the member znode may need registering again
        self._register_lock = t.Lock()
        self._gate_open: bool | None = None
        self._failed = False                   # the last round ended in an exception
        self._gate_logged_at = float("-inf")
        self._election = None
        self._master_seen: tuple[str | None, int] = (None, 0)  # (peer, epoch) of the epoch znode
        self._master_lock = t.Lock()
        self._thread = t.Thread(target=self._loop, name=f"election-{peer_id}", daemon=True)
        self._keeper = t.Thread(target=self._keep_member, name=f"member-{peer_id}", daemon=True)

    # -- public -----------------------------------------------------------
    def start(self) -> None:
        self._prepare_znodes()
        self.zk.add_listener(self._on_state)
        # kazoo re-arms the watch after every change and reconnect.
        self.zk.DataWatch(self.paths.epoch, self._note_master)
        try:
            self._register()
        except NoAuthError:
            raise ZkAccessDenied(self._member_path, identity_of(self.zk)) from None
        self._member_check.set()  # sets the watch on the znode just created
        self._keeper.start()
        self._thread.start()

    @property
    def is_master(self) -> bool:
        return self._master.is_set()

    @property
    def sessions_lost(self) -> int:
        """ZooKeeper sessions this peer lost (LOST) since it started (for the metrics)."""
        return self._losses

    @property
    def suspended(self) -> bool:
        """True while the ZooKeeper connection is down (the session may still be alive)."""
        return self._suspended.is_set()

    def may_write(self) -> bool:
        """True while this peer is master and its ZooKeeper connection is up."""
        return self._master.is_set() and not self._suspended.is_set()

    def current_master(self, fresh: bool = False) -> tuple[str | None, int]:
        """(peer ID, epoch) of the master ZooKeeper names: the epoch znode's writer and version.

        Kept current by a data watch; ``fresh`` reads the znode itself (unless the
        connection is down, when a read would wait for it). A worker admits an
        escalation batch only from this peer at this epoch.
        """
        if fresh and not self.suspended:
            try:
                data, stat = self.zk.get(self.paths.epoch)
                self._note_master(data, stat)
            except KazooException:
                pass
        return self._master_seen

    def _note_master(self, data: bytes | None, stat) -> None:
        if stat is None:
            return
        seen = ((data or b"").decode() or None, stat.version)
        with self._master_lock:  # a watch and a fresh read may race: keep the newest
            if seen[1] >= self._master_seen[1]:
                self._master_seen = seen

    def leader(self) -> str | None:
        """The peer ID that holds the election now, or None."""
        try:
            contenders = self.zk.Election(self.paths.election).contenders()
        except KazooException:
            return None
        return contenders[0] if contenders else None

    def handover(self, timeout_s: float) -> dict:
        """Give up the master role so that another peer takes it, without a session expiry."""
        if not self.is_master:
            return {"ok": False, "reason": "this peer is not master"}
        if self.suspended:  # a ZooKeeper call would wait for the connection, unbounded
            return {"ok": False, "reason": "ZooKeeper is unreachable: the role ends with the session"}
        others = [c for c in self.zk.Election(self.paths.election).contenders() if c != self.peer_id]
        if not others:
            return {"ok": False, "reason": "no other peer is waiting to take over"}
        t0 = self._threads.monotonic()
        self.step_down("handover")
        end = t0 + timeout_s
        while self._threads.monotonic() < end:
            leader = self.leader()
            if leader and leader != self.peer_id and self._master_epoch_moved():
                return {"ok": True, "new_master": leader, "seconds": self._threads.monotonic() - t0}
            self._threads.sleep(0.005)
        return {"ok": False, "reason": f"no other peer took over within {timeout_s} s",
                "seconds": self._threads.monotonic() - t0}

    def stop(self) -> None:
        self._stopping.set()
        self._member_check.set()
        self.step_down("stopping")
        election = self._election
        if election is not None:
            election.cancel()  # stop waiting in the queue
        # Cut off from ZooKeeper, every call waits for the connection: don't
        # wait for threads stuck in one; the session's end removes our znodes.
        wait_s = 1.0 if self.suspended else 10.0
        if self._thread.ident is not None:
            self._thread.join(timeout=wait_s)
        if self._keeper.ident is not None:
            self._keeper.join(timeout=wait_s)  # before the delete, so that it cannot re-create the znode
        self.zk.remove_listener(self._on_state)
        if self.suspended:
            return
        try:
            _, stat = self.zk.get(self._member_path)
            if stat.ephemeralOwner == self._session_id():  # never a newer incarnation's znode
                self.zk.delete(self._member_path, version=stat.version)
        except KazooException:
            pass

    def step_down(self, reason: str) -> None:
        self._demote_reason = reason
        self._demote.set()

    # -- internals --------------------------------------------------------
    def _master_epoch_moved(self) -> bool:
        try:
            _, stat = self.zk.get(self.paths.epoch)
        except KazooException:
            return False
        return stat.version > self.epoch

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: only flip flags (and log) here, never call ZooKeeper.
        if state == KazooState.SUSPENDED:
            if not self._suspended.is_set():
                self._suspended_at = self._threads.monotonic()
                self.disconnects += 1
                self._event(logging.WARNING, "zk_suspended", "%s: ZooKeeper connection lost; the session may "
                            "still be alive (a master stops writing)", self.peer_id, master=self.is_master)
            self._suspended.set()
        elif state == KazooState.LOST:
            if not self._suspended.is_set():
                self._suspended_at = self._threads.monotonic()
                self.disconnects += 1
            self._suspended.set()
            self._new_session = True
            self._losses += 1
            self._session_lost.set()
            self._event(logging.ERROR, "zk_session_lost", "%s: ZooKeeper session lost%s", self.peer_id,
                        "; stepping down" if self._master.is_set() else "", master=self.is_master)
            if self._master.is_set():
                self.step_down("session lost")
        else:
            if self._suspended.is_set():
                down = self._threads.monotonic() - self._suspended_at
                self._event(logging.INFO, "zk_reconnected", "%s: ZooKeeper connected again after %.1f s%s",
                            self.peer_id, down, " (new session)" if self._new_session else "",
                            seconds=round(down, 3), new_session=self._new_session)
            self._new_session = False
            self._suspended.clear()
            self._member_check.set()

    def _event(self, level: int, name: str, msg: str, *args, **fields) -> None:
        """An operator event (``twinflow.logs``) with the flow, this peer and the newest epoch known
        here, told to ``on_event`` too."""
        epoch = max(self.epoch, self._master_seen[1]) or None
        event(log, level, name, msg, *args, flow=self.flow, peer=self.peer_id, epoch=epoch, **fields)
        if self._on_event is not None:
            try:
                self._on_event(name, {"epoch": epoch, **fields})
            except Exception:  # a record lost must not break kazoo's listener or the election
                log.debug("on_event raised for %s", name, exc_info=True)

    def _next_epoch(self) -> int:
        stat = self.zk.set(self.paths.epoch, self.peer_id.encode())
        return stat.version

    def _lead(self) -> None:
        if self._stopping.is_set():
            return
        self.elected_at = self._clock()  # first: the lock was granted just now
        self.previous_master = self._master_seen[0]  # the epoch znode's writer, before this peer's epoch
        losses = self._losses
        epoch = self._next_epoch()
        self.epoch = epoch
        self._demote_reason = ""
        self._demote.clear()
        self._master.set()
        # A stop() or session loss just before the role was set found no master to demote.
        if self._losses != losses:
            self.step_down("session lost")
        elif self._stopping.is_set():
            self.step_down("stopping")
        # The member logs the promotion (event "promoted") once it has caught up and holds the role.
        log.debug("%s promoted to master, epoch %d", self.peer_id, epoch)
        failure = None
        try:
            try:
                self._on_promoted(epoch)
            except Exception as exc:
                failure = f"promotion failed: {exc}"
                raise
            self._demote.wait()
        finally:
            self._master.clear()
            reason = failure or self._demote_reason or "stopped"
            log.debug("%s demoted (%s), epoch %d", self.peer_id, reason, epoch)  # the member logs "demoted"
            self._on_demoted(reason)

    def _contend_now(self) -> bool:
        """Ask the may_contend gate; an exception counts as False."""
        try:
            open_ = bool(self._may_contend())
        except Exception:
            now = self._threads.monotonic()
            if now - self._gate_logged_at > 5.0:  # polled 10 times a second: don't flood the log
                self._gate_logged_at = now
                log.exception("%s: may_contend raised; not queueing for the election", self.peer_id)
            open_ = False
        if open_ != self._gate_open:
            self._gate_open = open_
            log.info("%s %s", self.peer_id, "queues for the election" if open_ else
                     "waits before queueing for the election (may_contend is False)")
        return open_

    def _drop_leftover_contenders(self) -> None:
        """Delete election nodes of this peer in our own session (checked after a failure): a
        release that failed leaves one, and a new Election would queue behind it, with every
        other peer, for as long as the session lives."""
        path = self.paths.election
        session = self._session_id()
        for child in self.zk.get_children(path):
            try:
                data, stat = self.zk.get(f"{path}/{child}")
            except NoNodeError:
                continue
            if stat.ephemeralOwner == session and data == self.peer_id.encode():
                log.warning("%s: removing its leftover election node %s", self.peer_id, child)
                try:
                    self.zk.delete(f"{path}/{child}", version=stat.version)
                except (NoNodeError, BadVersionError):
                    pass

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._session_lost.is_set():
                    if not self.zk.connected:
                        self._stopping.wait(0.05)
                        continue
                    self._register()
                    self._session_lost.clear()
                if not self._contend_now():
                    self._stopping.wait(GATE_POLL_S)
                    continue
                if self._failed:
                    self._drop_leftover_contenders()
                    self._failed = False
                # After a handover this queues behind the peer that was already
                # waiting (the lock is fair), so that peer takes over.
                self._election = self.zk.Election(self.paths.election, self.peer_id)
                if self._stopping.is_set():
                    break  # stop() may have missed this election: don't queue
                self._election.run(self._lead)
            except Exception:
                self._master.clear()  # _lead's finally did, unless it never set it
                self._failed = True
                if self._stopping.is_set():
                    log.info("election for %s ended while stopping", self.peer_id, exc_info=True)
                    break
                self._event(logging.ERROR, "election_failed", "election for %s failed; the peer queues again",
                            self.peer_id, exc_info=True)
                self._stopping.wait(RETRY_PAUSE_S)
