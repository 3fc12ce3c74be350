"""Escalation, the receiving side: a worker takes the master's claim batches and acknowledges each.

The sending side and what escalation promises are in ``escalation.py``.

Under failure: a batch this side refuses (wrong flow, too many claims, not
from the master at its epoch, a stale epoch, any error in the claim logic)
is acknowledged with ``accepted=False`` and the reason; the stream stays
open for the batches that follow, and the sender drops the refused batch.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Callable, NamedTuple

from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc

log = logging.getLogger("twinflow.escalation")

class Claim(NamedTuple):
    """One claim as the master escalates it and the worker takes it (the ``Claim`` message of
    ``proto/twinflow.proto``): the message the master processed, named as the worker's claim
    pair reads it."""

    ident: str     # the claim ID (``Ruleset.claim_id``)
    key: str       # the sort key as text, read again as the pair's key type
    position: str  # the message's uplink position: what the claim may release is at or before it
    ruleset: str   # the ruleset that took the message: the group it releases in


# A Claim from its four fields as one tuple: a C call, where Claim(...) runs a Python-level
# __new__ for every claim escalated or taken.
claim_of = partial(tuple.__new__, Claim)

# The most claims a worker takes in one batch (a flow's escalation_batch is at most 10,000):
# each costs the worker a bake lookup and an ID-cache read, so a larger batch is refused.
MAX_CLAIMS_PER_BATCH = 10_000


class StaleEpoch(Exception):
    """Raised by a worker's claim logic when a batch carries an epoch older than the newest it knows."""


class EscalationServicer(pb_grpc.EscalationServicer):
    """Receives escalation batches for one flow and acknowledges each one.

    ``admit(from_node, epoch)``, when given, says why a batch is refused
    (not from the master ZooKeeper names, not at its epoch) or None to take
    it. ``on_claims(epoch, claims)`` returns how many baked messages the
    claims released. A refused batch (wrong flow, not admitted,
    :class:`StaleEpoch`, any other error in ``on_claims``) is acknowledged
    with ``accepted=False`` and the reason, and counted in ``refused``; the
    stream stays open for the batches that follow.
    """

    def __init__(self, flow: str, on_claims: Callable[[int, list[Claim]], int],
                 admit: Callable[[str, int], str | None] | None = None, max_claims: int = MAX_CLAIMS_PER_BATCH):
        self.flow = flow
        self._handlers = {flow: (on_claims, admit)}
        self.max_claims = max_claims
        self.refused = 0

    @classmethod
    def for_flows(cls, handlers: dict[str, tuple[Callable[[int, list[Claim]], int],
                                                 Callable[[str, int], str | None] | None]]) -> "EscalationServicer":
        """One servicer for several flows (a sharded peer's shards): flow -> (on_claims, admit)."""
        servicer = cls(", ".join(handlers), lambda epoch, claims: 0)
        servicer._handlers = dict(handlers)
        return servicer

    def Escalate(self, request_iterator, context):
        # Headers now, before any batch, tell the sender the stream is open.
        context.send_initial_metadata(())
        for batch in request_iterator:
            ack = self._ack(batch)
            if not ack.accepted:
                self.refused += 1
            yield ack

    def _ack(self, batch: pb.EscalationBatch) -> pb.EscalationAck:
        on_claims, admit = self._handlers.get(batch.flow, (None, None))
        if on_claims is None:
            reason = f"wrong flow {batch.flow!r}, expected {self.flow!r}"
            return pb.EscalationAck(seq=batch.seq, accepted=False, reason=reason)
        if len(batch.claims) > self.max_claims:
            reason = f"{len(batch.claims)} claims in one batch; at most {self.max_claims}"
            return pb.EscalationAck(seq=batch.seq, accepted=False, reason=reason)
        claims = [claim_of((e.id, e.key, e.position, e.rule)) for e in batch.claims]
        try:
            why = admit(batch.from_node, batch.epoch) if admit is not None else None
            if why is not None:  # logged by admit, which knows this member and its epoch (escalation_refused)
                return pb.EscalationAck(seq=batch.seq, accepted=False, reason=why)
            claimed = on_claims(batch.epoch, claims)
        except StaleEpoch as exc:
            return pb.EscalationAck(seq=batch.seq, accepted=False, reason=f"stale epoch {batch.epoch}: {exc}")
        except Exception as exc:  # one bad batch must not end the stream
            log.exception("escalation batch %d from %s failed", batch.seq, batch.from_node)
            return pb.EscalationAck(seq=batch.seq, accepted=False, reason=f"{type(exc).__name__}: {exc}")
        return pb.EscalationAck(seq=batch.seq, accepted=True, claimed=claimed)
