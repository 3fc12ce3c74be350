"""What the gRPC Ingest checks in the bodies it is given: no resubmit envelope, and the message IDs
of a named publisher's bodies.

A resubmit envelope (``runtime/resubmit.py``) runs its message once more at the node it names,
under an identity the ID cache does not hold; only an operator's resubmit (the Admin service,
or Redis access) may write one, so the Ingest refuses a body that is one. A body the flow
cannot decode is not refused here: it reaches the uplink and leaves by the failure stream, as
any bad input does. With a publisher, each body's message ID is read (with the flow's own
bounded decoder), so that the publisher can be recorded for it (``tf:{F}:pub:<ID>``) and the
error notices of the message name it.

Under failure: nothing here touches a server; a refusal raises :class:`IngestRefused` before
anything is written, naming the body by its place in the request.

>>> from twinflow.runtime.message import MessageSpec
>>> read_bodies([b'{"id": "a"}', b'not json', b'{"id": 7}'], MessageSpec(), "shop")
['a', None, '7']
>>> read_bodies([b'{"twinflow_resubmit": {"audit": "1-0", "node": ""}, "message": {"id": "a"}}'], MessageSpec(), "")
Traceback (most recent call last):
...
twinflow.cluster.ingest_bodies.IngestRefused: body 0 is a resubmit envelope (top-level key twinflow_resubmit): \
only an operator's resubmit writes one (twinflow failures resubmit)
"""

from __future__ import annotations

import re

from ..runtime import resubmit
from ..runtime.fields import BadInput
from ..runtime.message import MessageSpec, Resubmitted, decode

PUBLISHER = re.compile(r"[A-Za-z0-9_.:@/-]{1,128}")
_KEY = resubmit.KEY.encode()


class IngestRefused(ValueError):
    """A publish refused before anything was written (answered as ``INVALID_ARGUMENT``)."""


def check_publisher(publisher: str) -> None:
    """IngestRefused unless ``publisher`` is "" (none) or a publisher name."""
    if publisher and not PUBLISHER.fullmatch(publisher):
        raise IngestRefused(f"publisher {publisher[:40]!r} must be 1-128 letters, digits or '_.:@/-'")


def _may_be_envelope(body: bytes) -> bool:
    """Whether ``body`` could decode to an envelope: it names the key, escapes characters (which
    could spell it), or is not plain UTF-8 JSON text starting with an object."""
    return _KEY in body or b"\\u" in body or body.lstrip()[:1] != b"{"


def read_bodies(bodies: list[bytes], spec: MessageSpec, publisher: str) -> list[str | None]:
    """Each body's message ID, None where it has none the flow can read (all None without
    ``publisher``); IngestRefused for a body that is a resubmit envelope or a bad publisher name."""
    check_publisher(publisher)
    ids: list[str | None] = [None] * len(bodies)
    for i, body in enumerate(bodies):
        if not publisher and not _may_be_envelope(body):
            continue
        try:
            m = decode("0-0", body, spec)
        except BadInput:
            continue  # bad input: it goes to the uplink, and leaves by the failure stream
        if isinstance(m, Resubmitted):
            raise IngestRefused(f"body {i} is a resubmit envelope (top-level key {resubmit.KEY}): only an "
                                f"operator's resubmit writes one (twinflow failures resubmit)")
        if publisher:
            ids[i] = m.id
    return ids
