"""Where a member starts reading its uplink, and the checks made before it does.

Under failure: a start that could break a promise is refused
(:class:`~twinflow.cluster.on_cluster.StartRefused`) with what to do: a
Redis that may evict or forget (unless ``cluster.redis_checks: warn``), a
checkpoint whose next entries were trimmed while the peer was away, a new
state directory on a flow that already processed entries without
``--start-from``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..runtime.positions import position_order
from ..secrets import redact_url

log = logging.getLogger("twinflow.peer")


from .on_cluster import StartRefused


class StartPosition:
    """A member's start checks (mixed into FlowMember)."""

    def _check_redis(self) -> None:
        """Refuse (or warn, per ``cluster.redis_checks``) a Redis that may evict or forget."""
        problems = self.store.config_problems()
        if not problems:
            return
        text = "; ".join(problems)
        if self.spec.redis_checks == "refuse":
            raise StartRefused(f"Redis at {redact_url(self.cfg.redis_url)} cannot keep the flow's promises: "
                               f"{text} (see docs/operations/redis.md; cluster.redis_checks: warn runs anyway)")
        log.warning("RUNNING ON A REDIS THAT CANNOT KEEP THE PROMISES: %s", text)

    def checkpoint_dir(self) -> Path:
        return Path(self.cfg.state_dir) / self.name / self.cfg.peer_id / "checkpoint"

    def _check_retention(self, resuming: bool) -> None:
        """Refuse to resume reading from a position whose following entries were trimmed."""
        if not resuming:
            return  # a new checkpoint starts where _start_position chose, which exists
        kept = self.store.trimmed_before()
        read = self.store.read_position()
        if kept is None or read is None or position_order(read) >= position_order(kept):
            return
        raise StartRefused(
            f"{self.cfg.peer_id} last read {self.keys.uplink} up to {read}, but the uplink was trimmed up to "
            f"{kept} while it was away (longer than uplink.retention = {self.spec.retention:.0f} s): what it "
            f"would read next is gone. Every trimmed entry was processed by the flow; start the peer on a new "
            f"state directory with --start-from processed")

    def _start_position(self) -> dict:
        """Where a new checkpoint starts reading (a checkpoint with commits resumes by itself).

        Chosen once per state directory and kept beside the checkpoint, so a
        restart before the first commit starts at the same place. A peer with
        a new state directory on a flow that has processed entries must be told
        where to start: after the processed mark, or from the beginning (safe,
        since nothing at or before the mark is delivered again, but slow).
        """
        checkpoint = self.checkpoint_dir()
        chosen = checkpoint.parent / "start.json"
        if chosen.exists():
            return json.loads(chosen.read_text())
        commits = checkpoint / "commits"
        if commits.is_dir() and any(commits.iterdir()):
            return {"id": "0-0", "n": 0}  # a checkpoint from before start.json existed
        mark = self.store.processed_mark()
        if mark is None or self.cfg.start_from == "beginning":
            start = {"id": "0-0", "n": 0}
        elif self.cfg.start_from == "processed":
            start = {"id": mark, "n": self.store.entries_upto(mark)}
        else:
            raise StartRefused(
                f"flow {self.name!r} has processed its uplink up to {mark}, but this peer has no "
                f"checkpoint in {checkpoint}: pass --start-from processed (read after {mark}; the usual "
                f"choice for a new or rebuilt peer) or --start-from beginning (re-read the whole uplink; "
                f"entries up to {mark} are never delivered again)")
        oldest = self.store.oldest_after(mark)
        # The entry's ID is Redis's time, as the flow's clock is (flow_clock.py).
        if oldest is not None and self.clock.now() - position_order(oldest)[0] / 1000 > self.spec.message.id_ttl:
            log.warning("the oldest unprocessed uplink entry (%s) is older than id_ttl (%d s): a re-published "
                        "duplicate of a message processed before it may no longer be recognised by its ID",
                        oldest, self.spec.message.id_ttl)
        chosen.parent.mkdir(parents=True, exist_ok=True)
        chosen.write_text(json.dumps(start))
        log.info("%s starts reading %s after %s", self.cfg.peer_id, self.keys.uplink, start["id"])
        return start
