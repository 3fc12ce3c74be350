"""What one master session's batch or firing did (:class:`Outcome`): counts, the claims to
escalate, why the session ended early and the uncommitted rest.

Under failure: an outcome only records; a step is counted in it once its COMMIT succeeded
(``master_session``), so a refused or failed step leaves no count behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..runtime.message import Message
from ..runtime.store.store_errors import Fenced, RedisUnavailable
from .escalation_servicer import Claim, claim_of


@dataclass
class Outcome:
    """What one :meth:`MasterSession.run_batch` or :meth:`MasterSession.fire` did."""

    delivered: int = 0   # messages run through the flow by committed steps
    skipped: int = 0     # messages of committed steps that were processed already
    failed: int = 0      # messages that left by the failure stream (the flow refused them)
    steps: int = 0       # steps committed
    # (claim ID, key as text, position, ruleset) to escalate: one per message a claim pair's
    # ruleset takes (a nohit message was never held by the worker, so it needs no claim)
    claims: list[Claim] = field(default_factory=list)
    refused: Fenced | RedisUnavailable | None = None  # why the session ended here, if it did
    rest: list[Message] | None = None  # run_batch: the uncommitted rest (None: all of it committed)

    def committed(self, chunk: list[Message], fresh: list[Message], escalate: bool) -> None:
        self.steps += 1
        self.delivered += len(fresh)
        self.skipped += len(chunk) - len(fresh)
        if escalate:
            self.claims.extend(claim_of((m.cid, str(m.key), m.position, m.rule)) for m in chunk if m.rule is not None)
