"""Uplink rows (position, data, size) as a node reads them, decoded into messages.

Used wherever a batch arrives: the node's driver (``node.FlowNode``) and an
executor running a shard's partition (``shard_task``). Never raises for what
an entry holds: an entry that cannot be decoded, has no ``data`` field or
whose body the reader withheld (over ``message.max_bytes``) comes back in
``bad`` as ``(position, reason, body, size)``, for the failure stream.
"""

from __future__ import annotations

from ..runtime.fields import BadInput
from ..runtime.message import Message, MessageSpec, decode
from ..runtime.spark.source import WARMUP_POSITION


def decode_rows(rows, spec: MessageSpec) -> tuple[list[Message], list[tuple], bool]:
    """Messages, bad entries, and whether the rows held the stream's warm-up row."""
    msgs: list[Message] = []
    bad: list[tuple] = []
    warm = False
    for position, data, size in rows:
        if position == WARMUP_POSITION:
            warm = True
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
