"""The resubmit envelope: how a failed message goes back into its flow, once more, as an uplink entry.

An operator's resubmit (``twinflow failures resubmit``) writes one uplink entry
whose body wraps the message that failed::

    {"twinflow_resubmit": {"audit": "<audit ID>", "node": "<node>", "id": "<ID>"}, "message": <the document>}

``decode`` (``runtime/message.py``) reads it as a :class:`Resubmitted` message:
its ``id``, the identity the ID cache, the processed mark and the claim pair
track, is the original ID with ``~resubmit:<audit ID>`` after it, so one audit
entry's resubmit runs once whatever the cache holds of the original; the
nodes get the original ID and document (``msg()``); the master feeds it at
``node``, the node it failed at ("" : the flow's input). ``id`` is the ID the
node saw (a group's, such as ``o1+p1``, is not in its document); without it
the ID is read from the document as for any message. The top-level key
``twinflow_resubmit`` is reserved: the gRPC Ingest refuses a body that has it.

Under failure: reading an envelope never raises anything but BadInput, whose
reason names what is wrong; such an entry leaves by the failure stream like
any other bad input.

>>> body = envelope("1700000000000-3", "deliver", {"id": "o7", "n": 1}, "o7")
>>> read_envelope(json.loads(body))
('1700000000000-3', 'deliver', 'o7', {'id': 'o7', 'n': 1})
>>> read_envelope({"twinflow_resubmit": {"audit": "x", "node": "a"}, "message": {}})
Traceback (most recent call last):
...
twinflow.runtime.fields.BadInput: resubmit envelope: twinflow_resubmit.audit must be an audit ID such as \
1700000000000-0 (got 'x')
"""

from __future__ import annotations

import json
import re
from typing import Any

from .fields import BadInput

KEY = "twinflow_resubmit"      # the reserved top-level key of an envelope
SEPARATOR = "~resubmit:"       # between the original ID and the audit ID in the processed identity
AUDIT_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_NODE = re.compile(r"[A-Za-z0-9_.-]{0,64}")  # a node name, or "" for the flow's input


def envelope(audit_id: str, node: str, doc: dict, message_id: str = "") -> bytes:
    """The uplink body that resubmits ``doc`` (a failed message's document, whose ID the node saw
    was ``message_id``; "" : read it from the document) at ``node``."""
    head = {"audit": audit_id, "node": node, **({"id": message_id} if message_id else {})}
    return json.dumps({KEY: head, "message": doc}, separators=(",", ":"), ensure_ascii=False).encode()


def processed_id(original_id: str, audit_id: str) -> str:
    """The identity a resubmit is processed under: distinct per audit entry.

    >>> processed_id("o7", "1700000000000-3")
    'o7~resubmit:1700000000000-3'
    """
    return original_id + SEPARATOR + audit_id


def read_envelope(doc: dict) -> tuple[str, str, str | None, dict]:
    """``(audit ID, node, message ID or None, document)`` of an envelope (``doc`` has the key
    ``twinflow_resubmit``); BadInput naming the field when it is not one."""
    extra = sorted(set(doc) - {KEY, "message"})
    if extra:
        raise BadInput(f"resubmit envelope: unexpected field {_short(extra[0])} beside {KEY} and message")
    head = doc[KEY]
    if not isinstance(head, dict):
        raise BadInput(f"resubmit envelope: {KEY} must be an object (got {_kind(head)})")
    audit, node = head.get("audit"), head.get("node", "")
    if not isinstance(audit, str) or not AUDIT_ID.fullmatch(audit):
        raise BadInput(f"resubmit envelope: {KEY}.audit must be an audit ID such as 1700000000000-0 "
                       f"(got {_short(audit)})")
    if not isinstance(node, str) or not _NODE.fullmatch(node):
        raise BadInput(f"resubmit envelope: {KEY}.node must be a node name (got {_short(node)})")
    message_id = head.get("id")
    if message_id is not None and (not isinstance(message_id, str) or not message_id):
        raise BadInput(f"resubmit envelope: {KEY}.id must be a non-empty string (got {_short(message_id)})")
    if "message" not in doc:
        raise BadInput("resubmit envelope: it has no message")
    message = doc["message"]
    if not isinstance(message, dict):
        raise BadInput(f"resubmit envelope: message must be a JSON object (got {_kind(message)})")
    if KEY in message:
        raise BadInput("resubmit envelope: its message is an envelope itself")
    return audit, node, message_id, message


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
