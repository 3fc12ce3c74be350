"""A worker's claims: escalations admitted from the master and the bake they release.

Under failure: only the peer ZooKeeper names as master, at its epoch, is
admitted; a claim releases a baked message only once Redis proves it
processed (ID cache or processed mark), so no escalation, forged or buggy,
releases a message nobody processed; what Redis could not prove bakes on.
"""

from __future__ import annotations

import logging

from .escalation_servicer import StaleEpoch
from .roles import MASTER

log = logging.getLogger("twinflow.peer")


class NoPair:
    """The worker's side of a flow without a claim pair: nothing bakes, nothing is claimed."""

    pending = baked = claimed = unclaimed = rolled_back = nohit = 0

    def offer(self, msg, now, processed=False):
        return None

    def claim(self, claim_id, key, position, rule=""):
        return []

    def rule_pending(self):
        return {}

    def held_at(self, position):
        return None

    def resolved(self):
        return []

    def take_claims(self, claims):
        return []

    claimed_messages = settle_claims = staticmethod(lambda *args: [])

    def tick(self, now):
        return []

    def next_deadline(self):
        return None

    def release_upto(self, position):
        return 0

    def rollback(self):
        return []


class Claims:
    """A member's escalation admission and claims (mixed into FlowMember)."""

    # -- escalations from the master --------------------------------------
    def admit_escalation(self, from_node: str, epoch: int) -> str | None:
        """Why a batch from ``from_node`` at ``epoch`` is refused, or None to take it: only the
        peer ZooKeeper names as master (the epoch znode's writer), at that master's epoch."""
        why = None
        if self.leadership is None:
            why = "this peer has not joined the flow yet"
        elif epoch < self.known_epoch:
            why = f"stale epoch {epoch}: epoch {self.known_epoch} exists"
        else:
            master, master_epoch = self.leadership.current_master()
            if epoch > master_epoch:  # promoted since our watch last fired? ask ZooKeeper itself
                master, master_epoch = self.leadership.current_master(fresh=True)
            if epoch != master_epoch:
                why = f"epoch {epoch} is not the master's ({master_epoch})"
            elif from_node != master:
                why = f"{from_node!r} is not the master ({master!r} is, at epoch {master_epoch})"
        if why is not None:
            with self._lock:
                self.escalations_refused += 1
            self._event(logging.WARNING, "escalation_refused", "refused an escalation batch of %s from %s: %s",
                        self.name, from_node, why, from_node=from_node, from_epoch=epoch, reason=why)
        return why

    def on_claims(self, epoch: int, claims: list[tuple[str, str, str, str]]) -> int:
        """Release the baked messages an escalation claims, once Redis proves them processed
        (ID cache or processed mark, one round trip): a claim is a hint, the ID cache the
        record, so no escalation, forged or buggy, releases a message nobody processed.
        Returns how many were released."""
        if epoch < self.known_epoch:
            raise StaleEpoch(f"epoch {epoch} is older than {self.known_epoch}")
        parse = self.spec.message.parse_key
        with self._lock:
            self.escalations_taken += 1
            self.known_epoch = max(self.known_epoch, epoch)
            if self.role == MASTER:
                return 0  # a newer master is us: nothing of ours is baked
            taken = self.take_claims_of(claims, parse)
        proven = [False] * len(taken)
        try:
            if taken:
                proven = self.store.processed(self.sort.claimed_messages(taken), deadline_s=self.lease_s)
        finally:  # also when Redis failed: what was not proven bakes on
            with self._lock:
                released = len(self.sort.settle_claims(taken, proven))
                self.claims_unproven += proven.count(False)
        self._update_backpressure()
        return released

    def take_claims_of(self, claims: list[tuple[str, str, str, str]], parse) -> list:
        """The sort's take of the claims whose key reads as the pair's key type (caller holds the
        lock). A key that does not read is a claim no master of this flow made: it releases
        nothing, and what it names bakes on until a good claim, the mark or a rollback."""
        good = []
        for cid, key, pos, rule in claims:
            try:
                good.append((cid, parse(key), pos, rule))
            except ValueError:  # BadInput is one
                self.claims_unproven += 1
        return self.sort.take_claims(good)

    def escalation_targets(self) -> dict[str, str]:
        """The other members' gRPC addresses; raises MembersUnknown while ZooKeeper cannot
        say (the sender then keeps its targets and their buffered claims)."""
        members = self.leadership.members() if self.leadership else {}
        members.pop(self.cfg.peer_id, None)
        return members
