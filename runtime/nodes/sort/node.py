"""The sort node itself: rulesets in order, the implicit ``nohit``, timers and state per ruleset."""

from __future__ import annotations

from typing import Any

from ...fields import BadInput
from ..base import Emit, Msg, Node
from .claim import DONE, FAILURE
from .rules import (KEY_TYPES, NOHIT, _NO_INFO, Pattern, Ruleset, _Bake, _Claiming, _ClaimBake, _Claims,
                    _Session, _Static)

BYPASS, ROLLBACK = "bypass", "rollback"
OUTLINKS = (DONE, BYPASS, FAILURE, NOHIT, ROLLBACK)  # QFlow's four, in its order, then ours


class SortNode(Node):
    """The flow-file sort node (kind ``sort``); see the module docstring. Build it with :func:`build`."""

    kind = "sort"
    outlinks = OUTLINKS

    def __init__(self, name: str, rulesets: list[Ruleset], *, key_type: str = "int", id_ttl: float = 86400.0,
                 unclaimed_outlink: str = DONE, rollback_on: Pattern | None = None, max_pending: int = 1_000_000,
                 names: tuple[str, str, str, str] | None = None):
        super().__init__(name)
        # QFlow lets the four outlinks carry any names: done, bypass, failure, nohit, in that order.
        renamed = names is not None and tuple(names) != OUTLINKS[:4]
        self._names = dict(zip(OUTLINKS, names)) if renamed else None
        if renamed:
            self.outlinks = (*names, ROLLBACK)
        self.max_pending = max_pending
        self._parse_key = KEY_TYPES[key_type]
        self._rollback_on = rollback_on
        claim_mode = any(r.type == "claim" for r in rulesets)
        if rollback_on is not None and not claim_mode:
            raise ValueError("rollback_on needs claim mode (a ruleset of type claim)")
        self._claims = _Claims(id_ttl, unclaimed_outlink) if claim_mode else None
        self._rules = [self._behaviour(r) for r in rulesets]
        timed = [r for r in self._rules if isinstance(r, (_Session, _Bake))]
        self._timers: list = [self._claims] if claim_mode else timed
        # State per ruleset (see base); claim mode keeps its cache in this process only.
        self.state_in_redis = not claim_mode
        self._by_name = {rule.spec.name: rule for rule in self._rules}
        self._changed: set[str] = set()
        # The earliest deadline as (timer, time), or None when something changed
        # since it was found: the engine asks for it before every message.
        self._due: tuple[Any, float | None] | None = None

    def _behaviour(self, spec: Ruleset):
        if self._claims is not None:
            return (_Claiming if spec.type == "claim" else _ClaimBake)(spec, self._claims)
        if spec.bake_time > 0:
            return _Bake(spec)
        if spec.session_timeout > 0:
            return _Session(spec)
        return _Static(spec)

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        out = self._route(msg, now)
        return out if self._names is None else self._renamed(out)

    def _renamed(self, out: list[Emit]) -> list[Emit]:
        names = self._names
        return [Emit(names.get(e.outlink, e.outlink), e.msgs, e.info) for e in out]

    def _route(self, msg: Msg, now: float) -> list[Emit]:
        self._due = None
        doc = msg.doc
        if self._rollback_on is not None and self._rollback_on.matches(doc):
            out = self._claims.rollback()
            out.append(Emit(NOHIT, (msg,), _NO_INFO))
            return out
        for rule in self._rules:
            if rule.match is None or rule.match.matches(doc):
                break
        else:
            return [Emit(NOHIT, (msg,), _NO_INFO)]
        try:
            key = self._parse_key(rule.key.render(doc))
            ident = None if self._claims is None else rule.spec.claim_id(doc, key)
        except BadInput as exc:
            return [Emit(FAILURE, (msg,), {"reason": str(exc)})]
        self._changed.add(rule.spec.name)
        return rule.take(msg, key, ident, now)

    def changed_state(self) -> dict:
        if self._claims is not None:
            return {}
        changed, self._changed = self._changed, set()
        return {name: self._by_name[name].dump() for name in changed}

    def load_state(self, entries) -> None:
        for name, entry in entries.items():
            self._by_name[name].load(entry)
        self._due = None

    def on_time(self, now: float) -> list[Emit]:
        out: list[Emit] = []
        while True:
            timer, at = self._earliest()
            if timer is None or at > now:
                return out if self._names is None else self._renamed(out)
            out += timer.fire(at)
            if timer is not self._claims:
                self._changed.add(timer.spec.name)
            self._due = None

    def next_deadline(self) -> float | None:
        return self._earliest()[1]

    def _earliest(self) -> tuple[Any, float | None]:
        if self._due is None:
            best, best_at = None, None
            for timer in self._timers:  # one per ruleset at most: never a scan of the held messages
                at = timer.deadline()
                if at is not None and (best is None or at < best_at):
                    best, best_at = timer, at
            self._due = (best, best_at)
        return self._due

    @property
    def rulesets(self) -> tuple[Ruleset, ...]:
        """The node's rulesets, in the order they are tried."""
        return tuple(rule.spec for rule in self._rules)

    def pending(self) -> int:
        return sum(rule.held for rule in self._rules)

    def rule_pending(self) -> dict[str, int]:
        """RULE_PEND: how many messages each ruleset holds (``nohit`` never holds any)."""
        counts = {rule.spec.name: rule.held for rule in self._rules}
        counts[NOHIT] = 0
        return counts

    def pending_counts(self) -> dict[str, Any]:
        return {"held": self.pending(), "rulesets": self.rule_pending()}

    @property
    def full(self) -> bool:
        """True at max_pending: an engine should stop reading (backpressure); the node never drops."""
        return self.pending() >= self.max_pending
