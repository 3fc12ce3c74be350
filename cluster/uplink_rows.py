"""Uplink rows (position, data, size) as a peer reads them, decoded into messages.

Used wherever a batch arrives: the driver (``member.FlowMember``) and an
executor running a shard's partition (``shard_task``). Never raises for what
an entry holds: an entry that cannot be decoded, has no ``data`` field or
whose body the reader withheld (over ``message.max_bytes``) comes back in
``bad`` as ``(position, reason, body, size)``, for the failure stream.
"""

from __future__ import annotations

import logging

import redis

from ..runtime.cluster_spec import ClusterSpec
from ..runtime.fields import BadInput
from ..runtime.message import Message, MessageSpec, decode
from ..runtime.positions import SKIPPED_SIZE, WARMUP_POSITION
from ..runtime.store.flow_store import FlowStore

log = logging.getLogger("twinflow.peer")


def decode_rows(rows, spec: MessageSpec) -> tuple[list[Message], list[tuple], bool]:
    """Messages, bad entries, and whether the rows held the stream's warm-up row."""
    msgs: list[Message] = []
    bad: list[tuple] = []
    warm = False
    for position, data, size in rows:
        if position == WARMUP_POSITION:
            warm = True
            continue
        if size == SKIPPED_SIZE:  # processed entries the reader skipped: nothing to decode
            continue
        if data is None and size is not None:  # the reader withheld a body over the limit
            bad.append((position, f"message is {size} bytes, over the limit of {spec.max_bytes}", None, size))
            continue
        try:
            msgs.append(decode(position, data, spec))
        except BadInput as exc:
            bad.append((position, exc.reason, data, size))
    return msgs, bad, warm


def last_position(rows) -> str | None:
    """The last uplink position among ``rows`` (the warm-up row is none)."""
    return next((r[0] for r in reversed(rows) if r[0] != WARMUP_POSITION), None)


def processed_as_worker(store: FlowStore, msgs: list[Message], last: str,
                        spec: ClusterSpec | None = None) -> tuple[list[Message], list[bool]]:
    """The messages a worker bakes and which of them are processed, recording how far it
    handled the uplink (``FlowStore.processed``), on the replicas ``spec.wait_replicas`` asks
    for: the worker's checkpoint moves past the batch next, and its in-memory bake is gone
    after a restart, so the record is all that makes its promotion catch-up cover the batch.
    A message whose ID no Redis key can be made of is left out (the master sends it to the
    failure stream): one such message must not fail the worker's batch, for ever, as it would
    fail the call for all of them."""
    wait = {} if spec is None else {"replicas": spec.wait_replicas, "replica_wait_ms": spec.replica_wait_ms}
    try:
        return msgs, store.processed(msgs, handled_upto=last, **wait)
    except (UnicodeError, redis.DataError):
        usable = [m for m in msgs if _usable_id(m.id)]
        log.error("%d message(s) with an ID no Redis key can hold are not baked", len(msgs) - len(usable))
        return usable, store.processed(usable, handled_upto=last, **wait)


def _usable_id(msg_id: str) -> bool:
    try:
        msg_id.encode("utf-8")
    except UnicodeError:
        return False
    return True


def record_bad(store: FlowStore, spec: ClusterSpec, bad: list[tuple], deadline_s: float | None = None) -> int:
    """Put a batch's bad entries (``decode_rows``'s ``bad``) on the failure stream, once each,
    as the flow's settings say (cap, body bytes kept, replicas that must confirm them)."""
    return store.record_failures(bad, max_entries=spec.failure_max_entries, max_body=spec.message.max_bytes,
                                 deadline_s=deadline_s, replicas=spec.wait_replicas,
                                 replica_wait_ms=spec.replica_wait_ms)
