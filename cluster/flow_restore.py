"""``twinflow restore``: a flow's keys from a backup file put back into a Redis, with a new fencing epoch.

:class:`Restore` first checks, touching nothing, and refuses (:class:`RestoreRefused`, one
line) when:

- the file is not whole, or holds another flow or other shards than the flow file names;
- the Redis is an older version than the one the backup was taken on (its ``RESTORE``
  cannot read newer payloads);
- a peer of the flow runs: a member znode in ZooKeeper (``/twinflow/<flow>/members``), or a
  status in Redis (``tf:{F}:node:<peer>``, which a peer writes twice a second and which
  expires 5 s after it stops). A peer stopped just now may show for a moment (its status; a
  killed peer's znode until its session times out): both are waited for up to
  ``wait_stopped_s``;
- the Redis holds keys of the flow already, unless ``replace``.

Then, for each shard: the epoch. The flow's epochs come from ZooKeeper (the epoch znode's
version: each promotion sets it once) and Redis fences with the newest it has seen
(``tf:{F}:epoch``). The restore takes one as a promotion does, above every epoch the backup,
the Redis and ZooKeeper hold, setting the znode until its version is there (a ZooKeeper
that is new, or lost the flow's znodes, is brought past the backup's epoch that way), and
makes it the fence: a master of any earlier term that still runs is fenced, and the next
promotion takes the epoch after it.

Then the keys, so that a half-restored flow never looks whole: in one transaction the mark
``tf:{F}:restoring`` and the new fence; then every other key of the flow deleted; then
every key of the file put back (``RESTORE``, with the time to live it had left when it was
copied, so that an ID-cache entry keeps the rest of its ``id_ttl``), but the epoch (the new
fence stands), the peers' statuses (they describe processes, not the flow; each peer writes
its own) and a former restore's record; then, in one transaction, the record of this
restore (``tf:{F}:restored``: its ID, time, file, the backup's time, the epoch) and the
mark removed. A peer refuses to start while the mark is there, and on a state directory
that began before the record's restore (``start_position.check_restore``). Replication
keeps that order: a replica promoted in between holds the mark too.

Under failure: a restore that stops part way (a Redis error, a kill) leaves the mark, so
no peer starts on it; running it again with ``replace`` starts over. An epoch taken from
ZooKeeper and not used is harmless: epochs only need to grow.
"""

from __future__ import annotations

import getpass
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from kazoo.exceptions import NoAuthError, NoNodeError

from ..runtime.backup_file import Record
from ..runtime.flowgraph import FlowGraph
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.key_copy import delete_keys, list_keys, redis_version, restore_keys, version_tuple
from .zk_auth import PARENT_ACL, ZkAccessDenied, identity_of
from .zk_paths import PARENT, ZkPaths

STATUS_POLL_S = 0.25  # how often a stopped peer's znode and status are looked for again


class RestoreRefused(RuntimeError):
    """The restore was refused before anything was written; the message says why, in one line."""


def iso(ms: int) -> str:
    """Epoch milliseconds as an ISO time in UTC.

    >>> iso(1764000000000)
    '2025-11-24T16:00:00.000Z'
    """
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def zk_members(zk, flow: str) -> list[str]:
    """The peers registered in ZooKeeper as members of ``flow`` (``membership.py``)."""
    path = ZkPaths(flow).members
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []
    except NoAuthError:
        raise ZkAccessDenied(path, identity_of(zk)) from None


def take_epoch(zk, flow: str, above: int) -> int:
    """An epoch of the restore's own for ``flow``, larger than ``above`` and than any ZooKeeper
    gave before: the epoch znode set (made, with the flow's znodes, if missing) until its
    version, the epoch, is past both (see the module doc)."""
    paths = ZkPaths(flow)
    path = PARENT
    try:
        # As a peer makes them (membership.py): the shared parent open to every flow.
        zk.ensure_path(PARENT, acl=PARENT_ACL)
        for path in paths.own():
            zk.ensure_path(path)
        path = paths.epoch
        version = zk.exists(path).version
        # Each set moves the version by one; sent together, answered in order.
        sets = [zk.set_async(path, b"") for _ in range(max(above, version) + 1 - version)]
        return max(s.get(timeout=30).version for s in sets)
    except NoAuthError:
        raise ZkAccessDenied(path, identity_of(zk)) from None


@dataclass
class _Shard:
    store: FlowStore
    info: dict               # the file's header for this shard
    records: list[Record]
    held: int = 0            # keys of the flow the Redis holds now
    epoch_now: int = 0       # the Redis's fencing epoch now
    left: bool = False       # an unfinished restore's mark is there


@dataclass
class Restore:
    """One restore of ``header``/``records`` (a backup file's) into ``stores`` (one per shard,
    in shard order) with ZooKeeper client ``zk``: :meth:`check`, then :meth:`run`."""

    graph: FlowGraph
    stores: list[FlowStore]
    zk: object
    header: dict
    records: list[Record]
    file: str
    replace: bool = False
    wait_stopped_s: float = 10.0
    by: str = field(default_factory=getpass.getuser)
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    _shards: list[_Shard] = field(default_factory=list, init=False)

    # -- the checks: nothing written ------------------------------------------
    def check(self) -> None:
        """Raise RestoreRefused naming the first reason not to restore (see the module doc)."""
        self._shards = self._match_file()
        self._check_versions()
        self._check_no_peer()
        self._check_empty()

    def _match_file(self) -> list[_Shard]:
        header, name = self.header, self.graph.name
        if header.get("flow") != name:
            raise RestoreRefused(f"{self.file} is a backup of flow {header.get('flow')!r}, not of {name!r} "
                                 f"(the flow file's)")
        mine = [s.keys.flow for s in self.stores]
        theirs = [s.get("flow") for s in header.get("shards", [])]
        if mine != theirs:
            raise RestoreRefused(f"{self.file} holds the shards {', '.join(map(str, theirs))}; the flow file has "
                                 f"{', '.join(mine)} (uplink.shards must be what it was at the backup)")
        by_prefix = {s.keys.prefix.encode(): [] for s in self.stores}
        for record in self.records:
            prefix = record.key[:record.key.index(b"}:") + 2] if b"}:" in record.key else b""
            if prefix not in by_prefix:
                raise RestoreRefused(f"{self.file} holds a key outside flow {name!r}: {record.key[:80]!r}")
            by_prefix[prefix].append(record)
        return [_Shard(store, info, by_prefix[store.keys.prefix.encode()])
                for store, info in zip(self.stores, header["shards"])]

    def _check_versions(self) -> None:
        for shard in self._shards:
            taken, here = shard.info.get("redis_version", ""), redis_version(shard.store.r)
            if version_tuple(here)[:2] < version_tuple(taken)[:2]:
                raise RestoreRefused(f"the backup was taken on Redis {taken}; this Redis is {here}, whose RESTORE "
                                     f"cannot read a newer Redis's payloads: restore into Redis {taken} or newer")

    def _check_no_peer(self) -> None:
        # A peer stopped just now may still show for a moment (its status expires 5 s after its
        # last write; a killed peer's member znode lives until its session times out): wait.
        end = self.monotonic() + self.wait_stopped_s
        while True:
            running = [(peer, shard.store.keys.flow, "a member in ZooKeeper") for shard in self._shards
                       for peer in zk_members(self.zk, shard.store.keys.flow)]
            running += [(row.get("peer_id", "?"), shard.store.keys.flow, "its status in Redis, written in the "
                         "last 5 s") for shard in self._shards for row in shard.store.read_statuses(deadline_s=3.0)]
            if not running:
                return
            if self.monotonic() >= end:
                peer, flow, seen = running[0]
                others = sorted({p for p, _, _ in running} - {peer})
                also = f" (and {', '.join(others)})" if others else ""
                raise RestoreRefused(f"peer {peer}{also} of flow {flow!r} is running ({seen}; waited "
                                     f"{self.wait_stopped_s:g} s): stop every peer of the flow first")
            self.sleep(STATUS_POLL_S)

    def _check_empty(self) -> None:
        for shard in self._shards:
            store = shard.store
            shard.held = len(list_keys(store.r, store.keys.prefix))
            restoring, _ = store.restore_marks(deadline_s=3.0)
            shard.left = restoring is not None
            shard.epoch_now = store.current_epoch(deadline_s=3.0)
            if shard.held and not self.replace:
                why = (f"a restore of it did not finish (from {restoring.get('file')!r}); "
                       if shard.left else "")
                raise RestoreRefused(f"this Redis already holds {shard.held:,} keys of flow {store.keys.flow!r} "
                                     f"({store.keys.prefix}...): {why}pass --replace to delete them and put the "
                                     f"backup's in their place")

    # -- the restore ------------------------------------------------------------
    def run(self) -> list[dict]:
        """Restore every shard (see the module doc); after :meth:`check`. Returns per shard what
        was done: flow, keys, epoch, deleted, and the backup's processed mark, uplink end and time."""
        if not self._shards:
            raise RuntimeError("Restore.run before Restore.check")
        done = []
        for shard in self._shards:
            store, keys = shard.store, shard.store.keys
            epoch = take_epoch(self.zk, keys.flow, max(int(shard.info.get("epoch", 0)), shard.epoch_now))
            began = self.now_ms()
            mark = json.dumps({"file": self.file, "at": iso(began), "by": self.by, "epoch": epoch})
            pipe = store.r.pipeline(transaction=True)
            pipe.set(keys.restoring, mark)
            pipe.set(keys.epoch, epoch)  # fenced from here on: a stale master's step is refused
            pipe.execute()
            deleted = delete_keys(store.r, keys.prefix, keep=(keys.restoring, keys.epoch))
            skip = {keys.epoch.encode(), keys.restoring.encode(), keys.restored.encode()}
            statuses = keys.peer("").encode()
            put = restore_keys(store.r, (r for r in shard.records
                                         if r.key not in skip and not r.key.startswith(statuses)))
            record = {"id": uuid.uuid4().hex, "at": iso(began), "file": self.file, "by": self.by,
                      "backup_time": iso(int(shard.info.get("redis_time_ms", 0))), "epoch": epoch, "keys": put}
            pipe = store.r.pipeline(transaction=True)
            pipe.delete(keys.restored)
            pipe.hset(keys.restored, mapping=record)
            pipe.delete(keys.restoring)
            pipe.execute()
            done.append({"flow": keys.flow, "keys": put, "epoch": epoch, "deleted": deleted,
                         "processed": shard.info.get("processed"), "uplink_last": shard.info.get("uplink_last"),
                         "backup_time": record["backup_time"]})
        return done
