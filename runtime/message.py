"""Messages as the flow sees them, decoded from uplink entries.

An uplink entry carries one JSON document in its ``data`` field. The flow
file names where the message ID and the sort key live in it. Decoding never
raises anything but :class:`BadMessage`, whose ``reason`` is what the
failure outlink records: the flow goes on with the next message.

>>> spec = MessageSpec(id_path="id", key_path="seq", key_type="int")
>>> m = decode("1700000000000-0", b'{"id": "a1", "seq": 7}', spec)
>>> (m.id, m.key, m.position)
('a1', 7, '1700000000000-0')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KEY_TYPES = {"int": int, "float": float, "str": str}


class BadMessage(ValueError):
    """An entry the flow cannot process; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class MessageSpec:
    """Where a message keeps its ID and sort key, and how large it may be."""

    id_path: str = "id"
    key_path: str = "key"
    key_type: str = "int"
    max_bytes: int = 1 << 20

    def parse_key(self, raw: Any) -> Any:
        """The sort key as ``key_type``; raises BadMessage when it is not one.

        Never converts with loss: 7.5 is not an int key, and neither is "7.5".
        """
        if isinstance(raw, bool) or raw is None or isinstance(raw, (dict, list)):
            raise BadMessage(f"key {raw!r} is not a {self.key_type}")
        try:
            if self.key_type == "int":
                key = raw if isinstance(raw, int) else int(raw) if isinstance(raw, str) else None
                if key is None and isinstance(raw, float) and raw.is_integer():
                    key = int(raw)
                if key is None:
                    raise ValueError
            else:
                key = KEY_TYPES[self.key_type](raw)
        except (TypeError, ValueError, OverflowError):
            raise BadMessage(f"key {raw!r} is not a {self.key_type}") from None
        if self.key_type == "float" and (key != key or key in (float("inf"), float("-inf"))):
            raise BadMessage(f"key {raw!r} does not order (NaN or infinite)")
        return key


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    key: Any
    position: str  # the uplink entry ID
    body: bytes


def field(doc: Any, path: str) -> Any:
    """The value at a dotted ``path`` in ``doc``; KeyError when it is absent."""
    value = doc
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def decode(position: str, data: bytes | None, spec: MessageSpec) -> Message:
    """Decode one uplink entry, or raise BadMessage with the reason."""
    if data is None:
        raise BadMessage("uplink entry has no 'data' field")
    if len(data) > spec.max_bytes:
        raise BadMessage(f"message is {len(data)} bytes, over the limit of {spec.max_bytes}")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadMessage(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadMessage("body is not a JSON object")
    try:
        raw_id = field(doc, spec.id_path)
    except KeyError:
        raise BadMessage(f"message has no ID field '{spec.id_path}'") from None
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or str(raw_id) == "":
        raise BadMessage(f"ID field '{spec.id_path}' is not a non-empty string or integer")
    try:
        raw_key = field(doc, spec.key_path)
    except KeyError:
        raise BadMessage(f"message has no key field '{spec.key_path}'") from None
    return Message(id=str(raw_id), key=spec.parse_key(raw_key), position=position, body=data)


def position_order(position: str) -> tuple[int, int]:
    """A Redis stream entry ID ("<ms>-<seq>") as a tuple that sorts in uplink order."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)
