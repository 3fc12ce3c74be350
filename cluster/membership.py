"""A peer's membership of a flow in ZooKeeper: its member znode, the flow's znodes and their ACL,
and the list of members the master escalates to.

It holds :class:`Membership`, the part of :class:`~.leadership.Leadership` (``leadership.py``)
that keeps ``/twinflow/<flow>/members/<peer>`` (ephemeral, the peer's gRPC address) and makes
the flow's znodes exist, protected by the client's ACL when ZooKeeper credentials are set
(``cluster/zk_auth.py``), and :class:`MembersUnknown`.

Promises under failure:

- Members list complete, so no message is left unclaimed: while a peer runs,
  its member znode exists, is owned by its own session and holds its
  address, so the master escalates to it. A peer restarted within its old
  session's timeout finds the old session's znode still there; it deletes it
  (version-checked) and creates its own, instead of adopting a znode that
  vanishes when the old session expires. A watch on the znode re-creates it
  whenever it disappears (deleted by anyone, or a session lost) while the
  peer runs; only ``stop()`` removes it for good.
- No guessed members: :meth:`Membership.members` raises :class:`MembersUnknown` when
  ZooKeeper cannot list them, never answers an empty list for "unknown".
- A flow this peer may not use fails at start: ``ZkAccessDenied`` names the path.
"""

from __future__ import annotations

import json
import logging

from kazoo.exceptions import (BadVersionError, ConnectionLoss, KazooException, NoAuthError, NoNodeError,
                              NodeExistsError)

from .zk_auth import PARENT_ACL, ZkAccessDenied, describe_acl, identity_of
from .zk_paths import PARENT

log = logging.getLogger("twinflow.leadership")

RETRY_PAUSE_S = 0.2    # pause after a failure before queueing again
MEMBER_CHECK_S = 5.0   # the member znode is also checked this often, watch or not


class MembersUnknown(RuntimeError):
    """ZooKeeper could not be asked who the members are (suspended or lost session)."""


class Membership:
    """The member znode and the flow's znodes of a :class:`~.leadership.Leadership`, whose
    ``__init__`` sets what these use (``zk``, ``flow``, ``peer_id``, ``paths``, the member path
    and data, the stop and member-check events, the register lock)."""

    def members(self) -> dict[str, str]:
        """Every registered peer: {peer_id: gRPC address}. Raises MembersUnknown when ZooKeeper
        cannot say: an empty answer would read as "no other peer is live", and the trim, which
        keeps what live peers have not read, would then drop a live worker's unread entries."""
        out = {}
        try:
            for child in self.zk.get_children(self.paths.members):
                try:
                    data, _ = self.zk.get(self.paths.member(child))
                    out[child] = json.loads(data)["address"]
                except (NoNodeError, ValueError, KeyError):
                    continue  # left (or wrote no address) between the listing and the read
        except KazooException as exc:
            raise MembersUnknown(f"ZooKeeper did not list the members of {self.flow}: {exc!r}") from exc
        return out

    def _prepare_znodes(self) -> None:
        """Make the flow's znodes exist; with credentials, protected by the client's ACL.

        Raises ZkAccessDenied, naming the path, when ZooKeeper refuses this peer
        (no credentials, or other ones, on a protected flow), so that a peer
        fails at start with the reason instead of in its election thread.
        """
        acl = self.zk.default_acl
        path = PARENT
        try:
            # Explicitly: kazoo's ensure_path would give /twinflow the client's
            # default ACL, locking every other flow out of the shared parent.
            self.zk.ensure_path(PARENT, acl=PARENT_ACL)
            for path in self.paths.own():
                self.zk.ensure_path(path)
                if acl:
                    self._protect(path, acl)
            # ZooKeeper checks no ACL on exists(), so ensure_path passes on a
            # protected flow: listing the members tells whether this peer may use it.
            for path in (self.paths.members, self.paths.election):
                for child in self.zk.get_children(path):
                    if acl:
                        self._protect(f"{path}/{child}", acl, missing_ok=True)
        except NoAuthError:
            raise ZkAccessDenied(path, identity_of(self.zk)) from None

    def _protect(self, path: str, acl: list, missing_ok: bool = False) -> None:
        """Give ``path`` the peer's ACL if it has another one: a flow whose znodes were created
        before credentials were turned on (open to anyone) is protected by its first peer that
        has them, ephemeral znodes of peers still running without credentials included (those
        peers lose access to the flow from then on)."""
        try:
            current, _ = self.zk.get_acls(path)
            if sorted(current) == sorted(acl):
                return
            self.zk.set_acls(path, acl)
        except NoNodeError:
            if missing_ok:  # an ephemeral znode whose session just ended
                return
            raise
        log.warning("%s: %s had ACL %s; now %s (ZooKeeper credentials are set)", self.peer_id, path,
                    describe_acl(current), describe_acl(acl))

    def _session_id(self) -> int:
        client_id = self.zk.client_id
        if not client_id:
            raise ConnectionLoss("no ZooKeeper session")
        return client_id[0]

    def _register(self) -> None:
        """Make the member znode exist, owned by our session, with our address."""
        path, data = self._member_path, self._member_data
        with self._register_lock:
            for _ in range(5):
                try:
                    self.zk.create(path, data, ephemeral=True)
                    return
                except NodeExistsError:
                    pass
                try:
                    old, stat = self.zk.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self._session_id():
                    if old != data:
                        try:
                            self.zk.set(path, data, version=stat.version)
                        except (NoNodeError, BadVersionError):
                            continue
                    return
                # Left by another session: most likely this peer before a fast
                # restart, not yet expired. Adopting it would lose it at that
                # session's expiry, so replace it with one of our own.
                log.warning("%s: member znode %s is held by session 0x%x, not ours: replacing it "
                            "(if this repeats, two running peers share the ID)",
                            self.peer_id, path, stat.ephemeralOwner)
                try:
                    self.zk.delete(path, version=stat.version)
                except (NoNodeError, BadVersionError):
                    pass
            raise KazooException(f"could not register {path}: it kept changing under us")

    def _on_member_event(self, event) -> None:
        # kazoo's event thread: only flag it, the member keeper does the work.
        self._member_check.set()

    def _keep_member(self) -> None:
        """Re-create the member znode whenever it is gone or not ours, until stop()."""
        while True:
            self._member_check.wait(MEMBER_CHECK_S)
            if self._stopping.is_set():
                return
            self._member_check.clear()
            if not self.zk.connected:
                continue  # CONNECTED sets _member_check again
            try:
                stat = self.zk.exists(self._member_path, watch=self._on_member_event)
                if stat is not None and stat.ephemeralOwner == self._session_id():
                    continue
                if self._stopping.is_set():
                    return
                log.warning("%s: member znode %s %s: registering again", self.peer_id, self._member_path,
                            "is gone" if stat is None else "belongs to another session")
                self._register()
                self._member_check.set()  # look again (and watch the new znode)
                self._stopping.wait(RETRY_PAUSE_S)  # two peers sharing an ID must not spin
            except Exception as exc:
                if self._stopping.is_set():
                    return
                log.warning("%s: checking member znode %s failed: %s; trying again",
                            self.peer_id, self._member_path, exc)
                self._member_check.set()
                self._stopping.wait(RETRY_PAUSE_S)
