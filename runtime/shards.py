"""Uplink shards: which shard a message belongs to, and what each shard is called.

A flow with ``uplink: {shards: N, shard_key: "{customer}"}`` has N uplinks.
Each shard is a flow of its own on the cluster: its own Redis keys under
its own hash tag (``tf:{F.s0}:uplink``, ``tf:{F.s0}:sink``, its ID cache,
processed mark, node state and fencing epoch), its own ZooKeeper election
(``/twinflow/F.s0``) and its own escalation stream, so one shard's master
can die, be fenced or roll back without touching another shard. With one
shard (the default) the names are the flow's own, so an unsharded flow's keys and
znodes carry no shard suffix.

A message goes to the shard given by a stable hash (CRC-32) of its
``shard_key`` rendered as text, so every producer, on every machine and in
every language, sends it to the same shard. Messages that must meet (a join
group, a history key, a sequence) must render the same key. A body that is
not a JSON object, or lacks the key's fields, goes to shard 0, where the
flow's decoder sends it to the failure stream with its reason: routing
never drops or refuses a message.

>>> router = ShardRouter(4, "{customer}")
>>> router.shard_of(b'{"id": 1, "customer": "c7"}') == router.shard_of(b'{"id": 2, "customer": "c7"}')
True
>>> router.shard_of(b'not json'), shard_name("orders", 2, 4), shard_name("orders", 0, 1)
(0, 'orders.s2', 'orders')
"""

from __future__ import annotations

import json
import zlib
from typing import Iterable

from .fields import MissingField, Template


def shard_name(flow: str, shard: int, shards: int) -> str:
    """The flow name shard ``shard`` of ``shards`` runs under (the flow's own with one shard)."""
    return flow if shards == 1 else f"{flow}.s{shard}"


class ShardRouter:
    """Assigns message bodies to shards (see the module doc)."""

    def __init__(self, shards: int, shard_key: str | None):
        if shards < 1:
            raise ValueError(f"shards must be at least 1, not {shards}")
        if shards > 1 and not shard_key:
            raise ValueError("a shard_key template is needed with more than one shard")
        self.shards = shards
        self.template = Template(shard_key) if shards > 1 else None

    def shard_of(self, body: bytes) -> int:
        if self.template is None:
            return 0
        try:
            doc = json.loads(body)
            key = self.template.render(doc) if isinstance(doc, dict) else None
        except (ValueError, MissingField, RecursionError):
            return 0
        if key is None:
            return 0
        return zlib.crc32(str(key).encode()) % self.shards

    def split(self, bodies: Iterable[bytes]) -> dict[int, list[tuple[int, bytes]]]:
        """``{shard: [(index in bodies, body), ...]}``, each list in the given order."""
        out: dict[int, list[tuple[int, bytes]]] = {}
        for i, body in enumerate(bodies):
            out.setdefault(self.shard_of(body), []).append((i, body))
        return out


def shard_graph(graph, shard: int):
    """``graph`` as shard ``shard`` runs it: the same nodes under the shard's flow name, so its
    keys, election and escalations are the shard's own."""
    from dataclasses import replace

    shards = graph.cluster.shards if graph.cluster else 1
    return replace(graph, name=shard_name(graph.name, shard, shards))
