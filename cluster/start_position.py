"""Where a member starts reading its uplink, and the checks made before it does.

Under failure: a start that could break a promise is refused
(:class:`~twinflow.cluster.on_cluster.StartRefused`) with what to do: a
Redis that may evict or forget (unless ``cluster.redis_checks: warn``), a
checkpoint whose next entries were trimmed while the peer was away, a new
state directory on a flow that already processed entries without
``--start-from``; and, after a restore from a backup (``twinflow restore``,
``flow_restore.py``), a start while the restore is under way or unfinished
(``tf:{F}:restoring``: the state is half the backup's), and a state directory
that began before the restore (its checkpoint has read the uplink as it was,
past entries the restored uplink holds unprocessed, which it would skip).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..runtime.positions import position_order
from ..secrets import redact_url
from .on_cluster import StartRefused

if TYPE_CHECKING:
    from ..runtime.store.flow_store import FlowStore
    from .member import FlowMember

log = logging.getLogger("twinflow.peer")


def check_redis(m: "FlowMember") -> None:
    """Refuse (or warn, per ``cluster.redis_checks``) a Redis that may evict or forget."""
    problems = m.store.config_problems()
    if not problems:
        return
    text = "; ".join(problems)
    if m.spec.redis_checks == "refuse":
        raise StartRefused(f"Redis at {redact_url(m.cfg.redis_url)} cannot keep the flow's promises: "
                           f"{text} (see docs/operations/redis.md; cluster.redis_checks: warn runs anyway)")
    log.warning("RUNNING ON A REDIS THAT CANNOT KEEP THE PROMISES: %s", text)


def checkpoint_dir(m: "FlowMember") -> Path:
    return Path(m.cfg.state_dir) / m.name / m.cfg.peer_id / "checkpoint"


def check_retention(m: "FlowMember", resuming: bool) -> None:
    """Refuse to resume reading from a position whose following entries were trimmed."""
    if not resuming:
        return  # a new checkpoint starts where start_position chose, which exists
    kept = m.store.trimmed_before()
    read = m.store.read_position()
    if kept is None or read is None or position_order(read) >= position_order(kept):
        return
    raise StartRefused(
        f"{m.cfg.peer_id} last read {m.keys.uplink} up to {read}, but the uplink was trimmed up to "
        f"{kept} while it was away (longer than uplink.retention = {m.spec.retention:.0f} s): what it "
        f"would read next is gone. Every trimmed entry was processed by the flow; start the peer on a new "
        f"state directory with --start-from processed")


def start_position(m: "FlowMember") -> dict:
    """Where a new checkpoint starts reading (a checkpoint with commits resumes by itself).

    Chosen once per state directory and kept beside the checkpoint, so a
    restart before the first commit starts at the same place. A peer with
    a new state directory on a flow that has processed entries must be told
    where to start: after the processed mark, or from the beginning (safe,
    since nothing at or before the mark is delivered again, but slow).
    """
    checkpoint = checkpoint_dir(m)
    chosen = checkpoint.parent / "start.json"
    if chosen.exists():
        return json.loads(chosen.read_text())
    commits = checkpoint / "commits"
    if commits.is_dir() and any(commits.iterdir()):
        return {"id": "0-0", "n": 0}  # unused: a checkpoint with commits resumes from them
    mark = m.store.processed_mark()
    if mark is None or m.cfg.start_from == "beginning":
        start = {"id": "0-0", "n": 0}
    elif m.cfg.start_from == "processed":
        start = {"id": mark, "n": m.store.entries_upto(mark)}
    else:
        raise StartRefused(
            f"flow {m.name!r} has processed its uplink up to {mark}, but this peer has no "
            f"checkpoint in {checkpoint}: pass --start-from processed (read after {mark}; the usual "
            f"choice for a new or rebuilt peer) or --start-from beginning (re-read the whole uplink; "
            f"entries up to {mark} are never delivered again)")
    oldest = m.store.oldest_after(mark)
    # The entry's ID is Redis's time, as the flow's clock is (flow_clock.py).
    if oldest is not None and m.clock.now() - position_order(oldest)[0] / 1000 > m.spec.message.id_ttl:
        log.warning("the oldest unprocessed uplink entry (%s) is older than id_ttl (%d s): a re-published "
                    "duplicate of a message processed before it may no longer be recognised by its ID",
                    oldest, m.spec.message.id_ttl)
    chosen.parent.mkdir(parents=True, exist_ok=True)
    chosen.write_text(json.dumps(start))
    log.info("%s starts reading %s after %s", m.cfg.peer_id, m.keys.uplink, start["id"])
    return start


def check_restore(m: "FlowMember", store: "FlowStore") -> None:
    """Refuse a start on a restore under way or unfinished, or on a state directory that began
    before the flow's last restore (see the module doc). A directory that has not begun (no
    start position chosen, no commits) records the restore it begins on, in ``restore.json``
    beside the checkpoint."""
    restoring, restored = store.restore_marks()
    if restoring is not None:
        raise StartRefused(
            f"flow {m.name!r}: a restore into this Redis is under way or did not finish (from "
            f"{restoring.get('file')!r}, begun at {restoring.get('at')}): a peer cannot start on half a state. "
            f"Let it end, or run twinflow restore again with --replace (docs/operations/deploy.md, backing up "
            f"and restoring a flow)")
    checkpoint = checkpoint_dir(m)
    home = checkpoint.parent
    commits = checkpoint / "commits"
    began = (home / "start.json").exists() or (commits.is_dir() and any(commits.iterdir()))
    seen = home / "restore.json"
    restore_id = restored.get("id") if restored else None
    if not began:
        if restore_id:
            home.mkdir(parents=True, exist_ok=True)
            seen.write_text(json.dumps({"restore": restore_id}))
        return
    began_on = json.loads(seen.read_text()).get("restore") if seen.exists() else None
    if restored is None or restore_id == began_on:
        return
    raise StartRefused(
        f"flow {m.name!r} was restored from a backup (taken at {restored.get('backup_time', '?')}, restored at "
        f"{restored.get('at', '?')}) after this peer's state directory {home} began: its checkpoint has read "
        f"uplink entries the restored flow does not hold. Move the directory aside and start the peer on a new "
        f"one with --start-from processed (docs/operations/deploy.md, backing up and restoring a flow)")
