"""Toxiproxy's toxics: what each does to the bytes of one direction of a proxied connection.

A toxic has a ``name``, a ``type``, a ``stream`` (``upstream``: client to
server, ``downstream``: server to client, the default), a ``toxicity`` (the
chance, 0..1, that it applies to a given connection, drawn once per
connection and toxic) and ``attributes``:

========== ===================================== ==============================================
type       attributes                            effect on the stream
========== ===================================== ==============================================
latency    latency (ms), jitter (ms)             each chunk waits latency ± jitter
bandwidth  rate (KB/s)                           at most rate KB per second
slow_close delay (ms)                            the close waits delay
timeout    timeout (ms)                          nothing passes; the connection closes after
                                                 timeout (0: stays open, data dropped)
reset_peer timeout (ms)                          the connection is reset (RST) after timeout
slicer     average_size, size_variation (bytes), chunks cut into pieces of about average_size,
           delay (µs)                            each followed by delay
limit_data bytes                                 the connection closes once that many bytes passed
cut        (none)                                nothing passes and nothing is dropped: bytes are
                                                 held and delivered in order once the toxic is
                                                 removed, and a client accepted meanwhile is
                                                 dialled upstream only then
========== ===================================== ==============================================

``cut`` is twinflow's own (Toxiproxy has no such type): a partition that
heals, as TCP sees one, where ``timeout`` at 0 drops what was sent. It is
meant at toxicity 1 and acts on both streams of the proxy whatever its own.

:func:`parse_toxic` validates a toxic as the HTTP API receives it and raises
:class:`BadToxic` (the API answers 400) naming the field.

>>> t = parse_toxic({"type": "latency", "attributes": {"latency": 200}})
>>> (t.name, t.stream, t.toxicity, t.attributes)
('latency_downstream', 'downstream', 1.0, {'latency': 200, 'jitter': 0})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STREAMS = ("upstream", "downstream")

# type -> attribute -> default (None: required)
TYPES: dict[str, dict[str, int | None]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
    "cut": {},
}


class BadToxic(ValueError):
    """A toxic the API refuses (400); the text says which field and why."""


@dataclass
class Toxic:
    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "stream": self.stream, "toxicity": self.toxicity,
                "attributes": dict(self.attributes)}

    def updated(self, body: dict) -> "Toxic":
        """This toxic with the fields of an update request changed (its name and type stay)."""
        merged = self.to_json()
        for key in ("stream", "toxicity"):
            if key in body:
                merged[key] = body[key]
        merged["attributes"] = {**self.attributes, **(body.get("attributes") or {})}
        return parse_toxic(merged)


def parse_toxic(body: Any) -> Toxic:
    """A toxic from an API request body; BadToxic says what is wrong."""
    if not isinstance(body, dict):
        raise BadToxic("the request body must be a JSON object")
    kind = body.get("type")
    if kind not in TYPES:
        raise BadToxic(f"type: unknown toxic type {kind!r} (known: {', '.join(TYPES)})")
    stream = body.get("stream") or "downstream"
    if stream not in STREAMS:
        raise BadToxic(f"stream: must be upstream or downstream (got {stream!r})")
    toxicity = body.get("toxicity", 1.0)
    if isinstance(toxicity, bool) or not isinstance(toxicity, (int, float)) or not 0 <= toxicity <= 1:
        raise BadToxic(f"toxicity: must be a number in 0..1 (got {toxicity!r})")
    given = body.get("attributes") or {}
    if not isinstance(given, dict):
        raise BadToxic("attributes: must be a JSON object")
    attributes = {}
    for name, default in TYPES[kind].items():
        value = given.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise BadToxic(f"attributes.{name}: must be a number >= 0 (got {value!r})")
        attributes[name] = value
    unknown = set(given) - set(TYPES[kind])
    if unknown:
        raise BadToxic(f"attributes: unknown for {kind}: {', '.join(sorted(unknown))}")
    name = body.get("name") or f"{kind}_{stream}"
    if not isinstance(name, str):
        raise BadToxic(f"name: must be a string (got {name!r})")
    return Toxic(name, kind, stream, float(toxicity), attributes)
