"""The claim pair's rulesets: which group a message bakes in, its sort key and its claim ID.

Both halves of a cluster's claim pair read each uplink message with the same
:class:`ClaimRules`: the worker to bake it in its ruleset's group, the master
to escalate, for each message it processed, the claim the worker needs (the
ruleset, the claim ID and the key as that ruleset builds them). The rulesets
are the sort node's (``rules.Ruleset``), read by ``read_rulesets``, so replay
and the cluster take one claim flow the same way:

- the first ruleset whose ``match`` takes the message is its ruleset (one
  without ``match`` takes every message); none: the message is ``nohit``;
- a baking ruleset (``type: sort``) holds the message in its own group until
  a claim of that group releases it;
- a claim ruleset's messages are claims: never held, and each claims, in
  every group, what its key and ID name (as in replay, where one claim
  releases held messages of any ruleset);
- the key is the ruleset's ``key`` template read as the node's one key type;
  the claim ID is its ``id`` template's value, and the key's one text where the
  ruleset has no ``id`` (QFlow: "if there is no IDTemplate defined, the ID
  will be same as the key"; ``Ruleset.claim_id``: 3 and 3.0 are one ID under
  ``key_type: float``), as replay's sort gives it.

Under failure: nothing here touches a server or a clock. A message whose
ruleset's key or ID cannot be built raises :class:`BadInput` with the
reason, on both halves alike, so it leaves by ``failure`` on both.

>>> from twinflow.runtime.fields import Template
>>> rules = ClaimRules((Ruleset("orders", Template("{seq}"), id=Template("{oid}"), bake_time=5.0),), "int")
>>> rules.classify({"seq": "7", "oid": 12})
('orders', 7, '12')
>>> rules.classify({"seq": 7, "oid": True})
Traceback (most recent call last):
...
twinflow.runtime.fields.BadInput: ruleset 'orders': ID True is not a non-empty string or integer
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...fields import BadInput, FieldPath, MissingField, Template
from ...sort_keys import parse_key
from .claim import ALL
from .rules import Ruleset

CLAIM = "claim"


def _single(t: Template) -> bool:
    return t.template == f"{{{t.fields[0].path}}}"


@dataclass(frozen=True)
class ClaimRules:
    """The claim pair's rulesets in order, their one key type, and the digits a key may have."""

    rulesets: tuple[Ruleset, ...]
    key_type: str = "int"
    max_digits: int = 100
    id_path: str | None = None  # the flow's message ID: an id template of just it reuses decode's ID
    baking: tuple[str, ...] = field(init=False)       # names of the rulesets that hold messages
    claiming: frozenset[str] = field(init=False)      # names of the claim rulesets
    # Per ruleset, what classify() reads, worked out once: every uplink message passes here.
    _plans: tuple = field(init=False, repr=False, compare=False)
    _int_below: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "baking", tuple(r.name for r in self.rulesets if r.type != CLAIM))
        object.__setattr__(self, "claiming", frozenset(r.name for r in self.rulesets if r.type == CLAIM))
        if not self.baking:
            raise ValueError("a claim pair needs a baking ruleset (type sort)")
        message_id = None if self.id_path is None else f"{{{self.id_path}}}"
        object.__setattr__(self, "_plans", tuple(
            (r, r.match, r.key.fields[0] if _single(r.key) else r.key,
             r.id is not None and r.id.template == message_id)
            for r in self.rulesets))
        # A plain integer key needs no parsing below this (parse_key's digit bound at most).
        object.__setattr__(self, "_int_below", 10 ** min(self.max_digits, 18) if self.key_type == "int" else 0)

    @classmethod
    def short_form(cls, key_path: str, key_type: str, id_path: str, bake_time: float,
                   max_digits: int = 100) -> "ClaimRules":
        """The pair's short form (``key``, ``bake_time``) as one baking ruleset, ``all``, that
        takes every message; its claim ID is the message ID, as the short form always had."""
        return cls((Ruleset(ALL, Template(f"{{{key_path}}}"), id=Template(f"{{{id_path}}}"),
                            bake_time=bake_time),), key_type, max_digits, id_path)

    def bake_times(self) -> dict[str, float]:
        """Each baking ruleset's bake time, in seconds."""
        return {r.name: r.bake_time for r in self.rulesets if r.type != CLAIM}

    def classify(self, doc: Any, message_id: str | None = None) -> tuple[str, Any, str] | None:
        """``(ruleset, key, claim ID)`` of the first ruleset that takes ``doc``; None: nohit.
        ``message_id``: the message's ID as decode read it (an ``id`` template of just the
        message ID field then takes it as it is).

        Raises BadInput, naming the ruleset, when its key or ID cannot be built."""
        for r, match, key_of, is_message_id in self._plans:
            if match is None or match.matches(doc):
                break
        else:
            return None
        try:
            raw = key_of.get(doc) if type(key_of) is FieldPath else key_of.render(doc)
            if type(raw) is int and -self._int_below < raw < self._int_below:
                key = raw  # what parse_key gives a plain int, without the call
            else:
                key = parse_key(self.key_type, raw, self.max_digits)
        except MissingField as exc:
            raise BadInput(f"ruleset {r.name!r}: message has no key field '{exc.args[0]}'") from None
        except BadInput as exc:
            raise BadInput(f"ruleset {r.name!r}: {exc}") from None
        if is_message_id and message_id is not None:
            return r.name, key, message_id
        try:
            ident = r.claim_id(doc, key)
        except MissingField as exc:
            raise BadInput(f"ruleset {r.name!r}: message has no ID field '{exc.args[0]}'") from None
        except BadInput as exc:
            raise BadInput(f"ruleset {r.name!r}: {exc}") from None
        return r.name, key, ident

    def fields(self) -> list[FieldPath]:
        """Every field path the rulesets read (matches, keys, IDs), in order, once each."""
        seen: dict[str, FieldPath] = {}
        for r in self.rulesets:
            paths = ([r.match.field] if r.match else []) + r.key.fields + (r.id.fields if r.id else [])
            for p in paths:
                seen.setdefault(p.path, p)
        return list(seen.values())
