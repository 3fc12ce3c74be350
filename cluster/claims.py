"""A worker's bake and claims: what it holds, the escalations it admits from the master, and
what they release.

A worker offers each batch to the claim pair's sort (messages the flow already processed
leave by bypass, the rest bake); an escalation claims baked messages, the sweep releases
everything at or before the processed mark, and what bakes fully without a claim is
surfaced on the unclaimed outlink (and stays held, so a promotion still delivers it).

Under failure: only the peer ZooKeeper names as master, at its epoch, is
admitted; a claim releases a baked message only once Redis proves it
processed (ID cache or processed mark), so no escalation, forged or buggy,
releases a message nobody processed; what Redis could not prove bakes on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..runtime.message import Message
from ..runtime.store.flow_store import SURFACED
from .escalation_servicer import Claim, StaleEpoch
from .roles import MASTER
from .uplink_rows import processed_as_worker

if TYPE_CHECKING:
    from .member import FlowMember

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
    """A member's bake, the escalations it admits and the claims they carry (see the module doc)."""

    def __init__(self, member: "FlowMember", sort):
        self.m = member
        self.sort = sort  # the claim pair's ClaimSortNode, or NoPair
        self._to_surface: list[tuple[Message, str]] = []  # (message, event) not yet written

    # -- the bake ---------------------------------------------------------------------
    def bake(self, msgs: list[Message], last: str) -> None:
        """Bake as worker (caller holds batch_lock); records how far this member handled the uplink."""
        m = self.m
        self.offer(*processed_as_worker(m.store, msgs, last, m.spec), last)

    def offer(self, msgs: list[Message], done: list[bool], last: str) -> None:
        """Offer messages to the sort, ``done`` saying which the flow processed already."""
        m = self.m
        now = m.clock.now()
        with m.state.lock:
            for msg, d in zip(msgs, done):
                self.sort.offer(msg, now, processed=d)
        m.state.handled(last)
        m.reader.update_hold()
        m.wake.set()

    def roll_back(self, delivered: int) -> None:
        """Drop the bake once a promotion delivered every message in it (``delivered`` of them)."""
        with self.m.state.lock:
            self.sort.rollback()
            self.m.state.count(rolled_back=delivered)

    def sweep(self) -> None:
        """Release every held message at or before the processed mark (one Redis read)."""
        mark = self.m.store.processed_mark(deadline_s=0)
        if mark is None:
            return
        with self.m.state.lock:
            released = self.sort.release_upto(mark)
        if released:
            self.m.reader.update_hold()

    def due(self, now: float) -> float | None:
        """Expire the bake at ``now`` (a worker's), queue what surfaced and how surfaced
        messages ended since; returns the bake's next deadline."""
        with self.m.state.lock:
            if self.m.state.role != MASTER:
                self._to_surface.extend((msg, SURFACED) for msg in self.sort.tick(now))
            self._to_surface.extend(self.sort.resolved())
            return self.sort.next_deadline()

    def surface(self) -> None:
        """Write what surfaced (and how surfaced messages ended) to the unclaimed outlink; on a
        Redis error they are written on the next call instead (they are still held)."""
        with self.m.state.lock:
            surface, self._to_surface = self._to_surface, []
        if not surface:
            return
        fresh = [msg for msg, event in surface if event == SURFACED]
        if fresh:
            log.warning("%d messages fully baked without a claim (first: %s)", len(fresh), fresh[0].id)
        try:
            pair = self.m.spec.pair
            self.m.store.surface_unclaimed(surface, pair.outlink_name(pair.unclaimed_outlink))
        except Exception:
            with self.m.state.lock:
                self._to_surface[:0] = surface
            raise

    # -- escalations from the master --------------------------------------
    def admit_escalation(self, from_node: str, epoch: int) -> str | None:
        """Why a batch from ``from_node`` at ``epoch`` is refused, or None to take it: only the
        peer ZooKeeper names as master (the epoch znode's writer), at that master's epoch."""
        m = self.m
        why = None
        if m.leadership is None:
            why = "this peer has not joined the flow yet"
        elif epoch < m.state.known_epoch:
            why = f"stale epoch {epoch}: epoch {m.state.known_epoch} exists"
        else:
            master, master_epoch = m.leadership.current_master()
            if epoch > master_epoch:  # promoted since our watch last fired? ask ZooKeeper itself
                master, master_epoch = m.leadership.current_master(fresh=True)
            if epoch != master_epoch:
                why = f"epoch {epoch} is not the master's ({master_epoch})"
            elif from_node != master:
                why = f"{from_node!r} is not the master ({master!r} is, at epoch {master_epoch})"
        if why is not None:
            m.state.count(escalations_refused=1)
            m.event(logging.WARNING, "escalation_refused", "refused an escalation batch of %s from %s: %s",
                    m.name, from_node, why, from_node=from_node, from_epoch=epoch, reason=why)
        return why

    def on_claims(self, epoch: int, claims: list[Claim]) -> int:
        """Release the baked messages an escalation claims, once Redis proves them processed
        (ID cache or processed mark, one round trip): a claim is a hint, the ID cache the
        record, so no escalation, forged or buggy, releases a message nobody processed.
        Returns how many were released."""
        m = self.m
        state = m.state
        if epoch < state.known_epoch:
            raise StaleEpoch(f"epoch {epoch} is older than {state.known_epoch}")
        parse = m.spec.message.parse_key
        with state.lock:
            state.count(escalations_taken=1)
            state.saw_epoch(epoch)
            if state.role == MASTER:
                return 0  # a newer master is us: nothing of ours is baked
            taken = self._take_claims_of(claims, parse)
        proven = [False] * len(taken)
        try:
            if taken:
                proven = m.store.processed(self.sort.claimed_messages(taken), deadline_s=m.lease_s)
        finally:  # also when Redis failed: what was not proven bakes on
            with state.lock:
                released = len(self.sort.settle_claims(taken, proven))
                state.count(claims_unproven=proven.count(False))
        m.reader.update_hold()
        return released

    def _take_claims_of(self, claims: list[Claim], parse) -> list:
        """The sort's take of the claims whose key reads as the pair's key type (caller holds the
        lock). A key that does not read is a claim no master of this flow made: it releases
        nothing, and what it names bakes on until a good claim, the mark or a rollback."""
        good = []
        for cid, key, pos, rule in claims:
            try:
                good.append((cid, parse(key), pos, rule))
            except ValueError:  # BadInput is one
                self.m.state.count(claims_unproven=1)
        return self.sort.take_claims(good)

    def escalation_targets(self) -> dict[str, str]:
        """The other members' gRPC addresses; raises MembersUnknown while ZooKeeper cannot
        say (the sender then keeps its targets and their buffered claims)."""
        m = self.m
        members = m.leadership.members() if m.leadership else {}
        members.pop(m.cfg.peer_id, None)
        return members
