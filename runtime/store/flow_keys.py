"""The Redis keys of one flow.

Every key of a flow shares the hash tag ``{flow}``, so a Redis Cluster keeps
them in one slot and a script may touch any of them at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlowKeys:
    flow: str
    uplink_stream: str = "uplink"
    sink_stream: str = "sink"

    @property
    def prefix(self) -> str:
        return f"tf:{{{self.flow}}}:"

    @property
    def uplink(self) -> str:
        return self.prefix + self.uplink_stream

    @property
    def sink(self) -> str:
        return self.prefix + self.sink_stream

    @property
    def failure(self) -> str:
        return self.prefix + "failure"

    @property
    def unclaimed(self) -> str:
        return self.prefix + "unclaimed"

    @property
    def epoch(self) -> str:
        return self.prefix + "epoch"

    @property
    def id_prefix(self) -> str:
        return self.prefix + "id:"

    @property
    def processed(self) -> str:
        """The uplink position up to which the flow's masters processed every entry."""
        return self.prefix + "processed"

    @property
    def version(self) -> str:
        """The state version: moved by every committed step (see scripts.COMMIT)."""
        return self.prefix + "version"

    @property
    def changes(self) -> str:
        """The change log: every committed step's version and the state entries it changed of
        the nodes that log them (see scripts.COMMIT, ``cluster/warm_state.py``)."""
        return self.prefix + "changes"

    @property
    def failed_prefix(self) -> str:
        return self.prefix + "failed:"

    @property
    def trimmed(self) -> str:
        """The first uplink entry kept by the last trim (every entry before it is gone)."""
        return self.prefix + "trimmed"

    @property
    def peers(self) -> str:
        return self.prefix + "nodes"  # "nodes" and "node:": the key names a running flow's data has

    def peer(self, peer_id: str) -> str:
        return self.prefix + "node:" + peer_id

    @property
    def events(self) -> str:
        """The events stream: the peers' records of role changes and failovers (``flow_events.py``)."""
        return self.prefix + "events"

    def sync(self, call: str) -> str:
        """The marker of one durable write, written with it before its ``WAIT`` (``durable.py``)."""
        return self.prefix + "sync:" + call

    @property
    def shape(self) -> str:
        """The state format and the nodes (with their kinds) of the twinflow that last started a peer
        on the flow (``cluster/flow_shape.py``)."""
        return self.prefix + "shape"

    @property
    def restoring(self) -> str:
        """The mark of a restore under way (``twinflow restore``): written before its first key,
        removed after its last; while it is there no peer starts on the flow."""
        return self.prefix + "restoring"

    @property
    def restored(self) -> str:
        """What the last finished restore was (its ID, the backup's time, the epoch it took): a
        peer's state directory older than it is refused (``cluster/start_position.py``)."""
        return self.prefix + "restored"

    @property
    def suspended(self) -> str:
        """The flow's suspensions: action node -> JSON (id, reason, since, until), written by the
        COMMIT of the step that suspended it, removed by the one that resumed it."""
        return self.prefix + "suspended"

    @property
    def resume(self) -> str:
        """An operator's request to end the suspensions it names (``twinflow resume``)."""
        return self.prefix + "resume"

    def state(self, node: str) -> str:
        """The hash of a flow node's state entries (key -> JSON)."""
        return self.prefix + "state:" + node

    def out(self, node: str, outlink: str) -> str:
        """The stream of what leaves the flow through ``node``'s unlinked ``outlink``."""
        return self.prefix + "out:" + node + ":" + outlink

    def step(self, token: str) -> str:
        """The marker of one committed master step (see scripts.COMMIT)."""
        return self.prefix + "step:" + token

    # -- the audit of failed messages and the publishers' notices (runtime/store/audit.py) --
    @property
    def audit(self) -> str:
        """The audit: one FAILED entry per message that left by a failure or error outlink, or
        that the flow could not take (the failure stream)."""
        return self.prefix + "audit"

    @property
    def audit_marks(self) -> str:
        """Audit ID -> JSON: the entry's RESUBMITTED or DISCARDED mark (who, when)."""
        return self.prefix + "audit:marks"

    @property
    def audit_outcomes(self) -> str:
        """Audit ID -> JSON: how the resubmit of that entry left the flow."""
        return self.prefix + "audit:outcomes"

    @property
    def audit_counts(self) -> str:
        """Counts of the audit's trims: removed, and removed_unhandled (still FAILED)."""
        return self.prefix + "audit:counts"

    @property
    def notices(self) -> str:
        """The error notices for publishers, in order (entry IDs are the readers' cursors)."""
        return self.prefix + "notices"

    @property
    def notices_removed(self) -> str:
        """How many notices the stream's cap has removed."""
        return self.prefix + "notices:removed"

    # -- the retention of the streams the flow writes (runtime/store/stream_retention.py) --
    def stream(self, name: str) -> str:
        """A stream the flow writes, by its name (``sink``, ``out:<node>:<outlink>``, ``failure``, ``notices``)."""
        return self.prefix + name

    @property
    def streams_trimmed(self) -> str:
        """Stream name -> the entries its retention removed so far."""
        return self.prefix + "streams:trimmed"

    @property
    def streams_unread(self) -> str:
        """Stream name -> of those, the entries after the smallest last-delivered-id of its consumer groups."""
        return self.prefix + "streams:unread"

    def publisher(self, message_id: str) -> str:
        """The publisher that gave message ``message_id`` over gRPC (kept as long as the ID cache)."""
        return self.prefix + "pub:" + message_id

    def read(self, peer_id: str) -> str:
        """Where a peer's uplink reader records how far it has read (read_n, read_id)."""
        return self.prefix + "read:" + peer_id
