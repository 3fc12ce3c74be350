"""Who is master: ZooKeeper election, epochs and membership for one flow.

Layout under ``/twinflow/<flow>``: ``election`` (kazoo's Election recipe),
``epoch`` (its data version is the epoch: every promotion sets it once, so
epochs grow by one per promotion and never repeat), and ``members/<node>``
(ephemeral, the node's gRPC address).

What happens on each connection state (kazoo ``KazooState``):

- SUSPENDED: the connection dropped; the session may still be alive. The
  master stops writing (``may_write()`` is False) until it is CONNECTED
  again; it keeps the role, because the session and the lock may survive.
- LOST: the session expired, so the lock is gone and another node may be
  master already. ``on_demoted("session lost")`` runs; once a new session is
  up the node registers again and queues for the election as a worker.
- CONNECTED: writing resumes if the node still holds the lock.

A stale master that misses all of this (paused, partitioned) cannot do harm:
its Redis writes carry its old epoch and are refused (fencing).

``on_promoted(epoch)`` and ``on_demoted(reason)`` run on the election thread,
one at a time, never concurrently with each other.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError, NodeExistsError

log = logging.getLogger("twinflow.leadership")


class Leadership:
    def __init__(
        self,
        zk: KazooClient,
        flow: str,
        node_id: str,
        address: str,
        on_promoted: Callable[[int], None],
        on_demoted: Callable[[str], None],
    ):
        self.zk = zk
        self.node_id = node_id
        self.address = address
        self.root = f"/twinflow/{flow}"
        self._on_promoted = on_promoted
        self._on_demoted = on_demoted
        self.epoch = 0
        self._master = threading.Event()
        self._suspended = threading.Event()
        self._demote = threading.Event()
        self._demote_reason = ""
        self._stopping = threading.Event()
        self._session_lost = threading.Event()
        self._election = None
        self._thread = threading.Thread(target=self._loop, name=f"election-{node_id}", daemon=True)

    # -- public -----------------------------------------------------------
    def start(self) -> None:
        for sub in ("election", "members", "epoch"):
            self.zk.ensure_path(f"{self.root}/{sub}")
        self.zk.add_listener(self._on_state)
        self._register()
        self._thread.start()

    @property
    def is_master(self) -> bool:
        return self._master.is_set()

    def may_write(self) -> bool:
        """True while this node is master and its ZooKeeper connection is up."""
        return self._master.is_set() and not self._suspended.is_set()

    def leader(self) -> str | None:
        """The node ID that holds the election now, or None."""
        try:
            contenders = self.zk.Election(f"{self.root}/election").contenders()
        except KazooException:
            return None
        return contenders[0] if contenders else None

    def members(self) -> dict[str, str]:
        """Every registered node: {node_id: gRPC address}."""
        out = {}
        try:
            for child in self.zk.get_children(f"{self.root}/members"):
                try:
                    data, _ = self.zk.get(f"{self.root}/members/{child}")
                    out[child] = json.loads(data)["address"]
                except (NoNodeError, ValueError, KeyError):
                    continue
        except KazooException:
            pass
        return out

    def handover(self, timeout_s: float) -> dict:
        """Give up the master role so that another node takes it, without a session expiry."""
        if not self.is_master:
            return {"ok": False, "reason": "this node is not master"}
        others = [c for c in self.zk.Election(f"{self.root}/election").contenders() if c != self.node_id]
        if not others:
            return {"ok": False, "reason": "no other node is waiting to take over"}
        t0 = time.monotonic()
        self.step_down("handover")
        end = t0 + timeout_s
        while time.monotonic() < end:
            leader = self.leader()
            if leader and leader != self.node_id and self._master_epoch_moved():
                return {"ok": True, "new_master": leader, "seconds": time.monotonic() - t0}
            time.sleep(0.005)
        return {"ok": False, "reason": f"no other node took over within {timeout_s} s",
                "seconds": time.monotonic() - t0}

    def stop(self) -> None:
        self._stopping.set()
        self.step_down("stopping")
        if self._election is not None:
            self._election.cancel()  # stop waiting in the queue
        self._thread.join(timeout=10)
        self.zk.remove_listener(self._on_state)
        try:
            self.zk.delete(f"{self.root}/members/{self.node_id}")
        except KazooException:
            pass

    # -- internals --------------------------------------------------------
    def _master_epoch_moved(self) -> bool:
        try:
            _, stat = self.zk.get(f"{self.root}/epoch")
        except KazooException:
            return False
        return stat.version > self.epoch

    def step_down(self, reason: str) -> None:
        self._demote_reason = reason
        self._demote.set()

    def _register(self) -> None:
        path = f"{self.root}/members/{self.node_id}"
        data = json.dumps({"address": self.address}).encode()
        try:
            self.zk.create(path, data, ephemeral=True)
        except NodeExistsError:
            # Left by this node's previous session, which may not have expired yet.
            self.zk.set(path, data)

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's event thread: only flip flags here, never call ZooKeeper.
        if state == KazooState.SUSPENDED:
            self._suspended.set()
        elif state == KazooState.LOST:
            self._suspended.set()
            self._session_lost.set()
            if self._master.is_set():
                self.step_down("session lost")
        else:
            self._suspended.clear()

    def _next_epoch(self) -> int:
        stat = self.zk.set(f"{self.root}/epoch", self.node_id.encode())
        return stat.version

    def _lead(self) -> None:
        self.epoch = self._next_epoch()
        self._demote.clear()
        self._master.set()
        log.info("%s promoted to master, epoch %d", self.node_id, self.epoch)
        try:
            self._on_promoted(self.epoch)
            self._demote.wait()
        finally:
            self._master.clear()
            log.info("%s demoted (%s), epoch %d", self.node_id, self._demote_reason, self.epoch)
            self._on_demoted(self._demote_reason or "stopped")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if self._session_lost.is_set():
                if not self.zk.connected:
                    time.sleep(0.05)
                    continue
                self._session_lost.clear()
                try:
                    self._register()
                except KazooException as exc:
                    log.warning("re-registering %s failed: %s", self.node_id, exc)
                    continue
            # After a handover this queues behind the node that was already
            # waiting (the lock is fair), so that node takes over.
            self._election = self.zk.Election(f"{self.root}/election", self.node_id)
            try:
                self._election.run(self._lead)
            except KazooException as exc:
                # Connection or session trouble while queued or releasing: queue again.
                log.warning("election for %s interrupted: %s", self.node_id, exc)
                self._stopping.wait(0.1)
