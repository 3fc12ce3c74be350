"""``twinflow backup``: every Redis key of a flow, copied at one instant while the flow runs, to a file.

Each shard of the flow (one for an unsharded flow) is copied under a pause of the Redis
that holds it (``runtime/store/key_copy.py``): its writes wait, its reads go on, and the
copy is the state between two of its steps, the state a crash of every peer at that
instant would have left, which the promises already cover. Shards are separate flows on
the cluster (their own epochs, marks and ID caches), so each is copied at an instant of
its own, one after the other. With the keys, the same pause reads what the restore and
the operator need to know: the Redis time, the fencing epoch, the processed mark, the
state version and the last uplink entry. The file is ``runtime/backup_file.py``'s.

Nothing of ZooKeeper is copied: the flow keeps there only its election and member
znodes (ephemeral: each peer makes its own as it starts) and the epoch znode, whose
version a restore moves past every epoch the backup or a peer could hold
(``flow_restore.py``). What ZooKeeper needs kept is the flow's credentials file.

Under failure: a copy that cannot be taken whole ends the backup with
:class:`BackupRefused`, nothing written (the file, if one was there, stays as it was): a
pause that would outlast its bound, a Redis that cannot pause, a flow that is being
restored. A Redis error raises as it is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from .. import __version__
from ..runtime.backup_file import write_backup
from ..runtime.flowgraph import FlowGraph
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.key_copy import CannotPause, PauseOverrun, copy_keys, version_tuple


class BackupRefused(RuntimeError):
    """The backup was not taken (nothing written); the message says why, in one line."""


def take_backup(graph: FlowGraph, stores: list[FlowStore], path: str | Path, bound_ms: int, *,
                monotonic: Callable[[], float] = time.monotonic) -> dict:
    """Copy every key of each shard's store (``stores``, in shard order) under a pause of at
    most ``bound_ms`` each, and write them to ``path``; returns the file's header."""
    shards, records = [], []
    for store in stores:
        keys = store.keys

        def also(pipe, keys=keys):
            pipe.get(keys.epoch)
            pipe.get(keys.processed)
            pipe.get(keys.version)
            pipe.xrevrange(keys.uplink, count=1)
            pipe.exists(keys.restoring)

        try:
            copy = copy_keys(store.r, keys.prefix, bound_ms, also=also, monotonic=monotonic)
        except PauseOverrun as exc:
            raise BackupRefused(
                f"flow {keys.flow!r}: {exc}; nothing written. The flow's writes waited that long. A larger "
                f"--max-pause-ms holds them longer (a master steps down when a write waits past "
                f"cluster.write_lease = {graph.cluster.write_lease:g} s); a flow this large is better copied "
                f"from a Redis snapshot (docs/operations/deploy.md, backing up and restoring a flow)") from None
        except CannotPause as exc:
            raise BackupRefused(f"flow {keys.flow!r}: {exc}; nothing written") from None
        epoch, mark, version, last, restoring = copy.also
        if restoring:
            raise BackupRefused(f"flow {keys.flow!r} is being restored, or a restore of it did not finish "
                                f"({keys.restoring}): there is no whole state to copy; nothing written")
        shards.append({"flow": keys.flow, "keys": len(copy.records), "redis_time_ms": copy.redis_time_ms,
                       "pause_ms": round(copy.pause_ms, 1), "epoch": int(epoch or 0),
                       "processed": _text(mark), "version": int(version or 0),
                       "uplink_last": _text(last[0][0]) if last else None, "redis_version": copy.redis_version})
        records += copy.records
    header = {"flow": graph.name, "shards": shards, "twinflow": __version__,
              "redis_version": max((s["redis_version"] for s in shards), key=version_tuple, default=""),
              "taken_ms": min((s["redis_time_ms"] for s in shards), default=0)}
    return write_backup(path, header, records)


def _text(raw) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw
