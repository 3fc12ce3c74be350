"""The sort node's rulesets: which messages each takes, its key, and its behaviour per mode.

Static, session and bake rulesets each keep their state as one entry (see
``runtime/nodes/base.py``); claim-mode rulesets share one :class:`_Claims`.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

from ...fields import BadInput, FieldPath, MissingField, Template
from ...sort_keys import KEY_TYPES as KEY_NAMES, parse_key
from ..base import Emit, Msg, msg_from_json, msg_json
from .claim import BYPASS, DONE, NOHIT, ClaimCache
from .min_queue import MinQueue

ROLLBACK = "rollback"
_NO_INFO: Any = MappingProxyType({})
_UNCLAIMED_INFO: Any = MappingProxyType({"reason": "not claimed within bake_time; held until claimed or rolled back"})


KEY_TYPES = {name: partial(parse_key, name) for name in KEY_NAMES}


def claim_id(v: Any) -> str:
    """A claim ID from an ``id`` template's value: a non-empty string or an integer (``1`` and ``"1"``
    are one ID, as message IDs are). A JSON ``true``/``false`` or a float is refused: ``1.0``
    and ``1`` would be one ID while ``"1.0"`` is another, and a bool is no identity at all."""
    if isinstance(v, str):
        if v:
            return v
        raise BadInput("ID is empty")
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    shown = repr(v) if len(repr(v)) <= 80 else f"{repr(v)[:40]}..."
    raise BadInput(f"ID {shown} is not a non-empty string or integer")


def key_claim_id(key: Any) -> str:
    """The claim ID of a ruleset without ``id`` (QFlow: "the ID will be same as the key"): the
    one text of a key as ``parse_key`` read it, so that equal keys are one ID.

    - ``int``: its decimal digits;
    - ``float``: the shortest text that reads back as the same float (``repr``: ``3.0``,
      ``1.5``, ``1e-07``), ``-0.0`` as ``0.0``. Under ``key_type: float`` the values 3 and
      3.0 are one key, 3.0, and so one ID, ``"3.0"``: the text the cluster's claim pair has
      always given a float key, so IDs written before stay valid;
    - ``str``: the key itself, refused when empty (an ID is never empty).

    >>> [key_claim_id(k) for k in (7, 3.0, 1.5, -0.0, 1e-07, "a-1")]
    ['7', '3.0', '1.5', '0.0', '1e-07', 'a-1']
    """
    if type(key) is float:
        return repr(key + 0.0)  # -0.0 + 0.0 is 0.0: equal keys, one text
    if type(key) is str and not key:
        raise BadInput("ID is empty (the ruleset has no id, so the ID is the key, and the key is empty)")
    return str(key)


@dataclass(frozen=True)
class Pattern:
    """Which messages a ruleset takes: the value at ``field`` equals ``equals``,
    or (with ``regex``) is a string in which the regular expression is found."""

    field: FieldPath
    equals: Any = None
    regex: re.Pattern | None = None

    def matches(self, doc: Any) -> bool:
        try:
            v = self.field.get(doc)
        except MissingField:
            return False
        if self.regex is not None:
            return isinstance(v, str) and self.regex.search(v) is not None
        # YAML's `equals: 1` must not take a JSON `true` (Python says True == 1).
        return v == self.equals and isinstance(v, bool) == isinstance(self.equals, bool)


@dataclass(frozen=True)
class Ruleset:
    """One ruleset as the flow file gives it (see the module docstring and docs/reference/nodes/sort.md)."""

    name: str
    key: Template
    match: Pattern | None = None          # None: every message
    type: str = "sort"                    # "sort", or "claim" (claim mode)
    bake_time: float = 0.0                # seconds
    session_timeout: float = 0.0          # seconds
    id: Template | None = None            # claim mode: the message's ID; default the key

    def claim_id(self, doc: Any, key: Any) -> str:
        """The claim ID of ``doc``, whose key (as ``parse_key`` read it) is ``key``: its ``id``
        template's value, or without one the key's text (:func:`key_claim_id`). Raises
        BadInput with the reason when there is none. Replay's sort and the cluster's claim
        pair both ask here, so one flow file gives one ID per message on both."""
        return key_claim_id(key) if self.id is None else claim_id(self.id.render(doc))


# -- one ruleset's behaviour per mode -------------------------------------------------------------
class _Rule:
    """What every ruleset's behaviour has: its spec, read once, and how many messages it holds."""

    held = 0

    def __init__(self, spec: Ruleset):
        self.spec, self.match, self.key = spec, spec.match, spec.key


class _Static(_Rule):
    """The first ascending series leaves through done, the rest through bypass."""

    _last: Any = None

    def dump(self) -> dict | None:
        return None if self._last is None else {"last": self._last}

    def load(self, entry: dict) -> None:
        self._last = entry["last"]

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        if self._last is None or key > self._last:
            self._last = key
            return [Emit(DONE, (msg,), _NO_INFO)]
        return [Emit(BYPASS, (msg,), _NO_INFO)]


class _Session(_Rule):
    """Holds everything; flushes in key order once the cache is quiet for session_timeout."""

    def __init__(self, spec: Ruleset):
        super().__init__(spec)
        self._timeout = spec.session_timeout
        # Two flat lists, not a tuple per message: a big session would otherwise
        # hand the garbage collector one more object to trace per message.
        self._keys: list[Any] = []
        self._msgs: list[Msg] = []
        self._changed = 0.0

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        self._keys.append(key)
        self._msgs.append(msg)
        self._changed = now
        self.held += 1
        return []

    def deadline(self) -> float | None:
        return self._changed + self._timeout if self._msgs else None

    def dump(self) -> dict | None:
        return {"keys": self._keys, "msgs": [msg_json(m) for m in self._msgs], "changed": self._changed} \
            if self._msgs else None

    def load(self, entry: dict) -> None:
        self._keys, self._msgs = list(entry["keys"]), [msg_from_json(m) for m in entry["msgs"]]
        self._changed, self.held = entry["changed"], len(self._msgs)

    def fire(self, at: float) -> list[Emit]:
        keys, msgs = self._keys, self._msgs
        self._keys, self._msgs, self.held = [], [], 0
        # A stable sort: equal keys keep their arrival order.
        return [Emit(DONE, (msgs[i],), _NO_INFO) for i in sorted(range(len(keys)), key=keys.__getitem__)]


class _Bake(_Rule):
    """QFlow's reference-message bake, with the threshold carried from session to session."""

    def __init__(self, spec: Ruleset):
        super().__init__(spec)
        self._bake_time = spec.bake_time
        self._threshold: Any = None                          # highest key flushed so far
        self._keys = MinQueue()                             # (key, arrival number, message)
        self._arrivals: deque[tuple[float, Any]] = deque()   # (arrival time, key); front: the reference
        self._seq = 0

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        if self._threshold is not None and key <= self._threshold:
            return [Emit(BYPASS, (msg,), _NO_INFO)]  # too late to be ordered among what has left
        self._seq += 1
        self._keys.push((key, self._seq, msg))
        self._arrivals.append((now, key))
        self.held += 1
        return []

    def deadline(self) -> float | None:
        arrivals = self._arrivals
        return arrivals[0][0] + self._bake_time if arrivals else None

    def dump(self) -> dict | None:
        if self._threshold is None and not self.held:
            return None
        held = sorted(self._keys.items())
        return {"threshold": self._threshold, "seq": self._seq, "arrivals": list(self._arrivals),
                "held": [[key, n, msg_json(m)] for key, n, m in held]}

    def load(self, entry: dict) -> None:
        self._threshold, self._seq = entry["threshold"], entry["seq"]
        self._arrivals = deque((t, key) for t, key in entry["arrivals"])
        self._keys = MinQueue((key, n, msg_from_json(m)) for key, n, m in entry["held"])
        self.held = len(entry["held"])

    def fire(self, at: float) -> list[Emit]:
        # Fully baked when the reference is: the messages that arrived with it
        # (nothing held arrived before it). Arrivals flushed earlier may still
        # sit among them; their keys are below the reference's, so the
        # maximum ignores them.
        arrivals = self._arrivals
        ref_arrival, top = arrivals[0]
        for arrived, key in arrivals:
            if arrived > ref_arrival:
                break
            if key > top:
                top = key
        self._threshold = top
        out = [Emit(DONE, (msg,), _NO_INFO) for _, _, msg in self._keys.pop_upto(top)]
        self.held -= len(out)
        while arrivals and arrivals[0][1] <= top:
            arrivals.popleft()
        return out


class _IdCache:
    """IDs the master processed, each kept ``ttl`` seconds after it was last claimed."""

    def __init__(self, ttl: float):
        self.ttl = ttl
        self._until: dict[str, float] = {}
        self._queue: deque[tuple[float, str]] = deque()  # (expiry, ID) in expiry order

    def __len__(self) -> int:
        return len(self._until)

    def add(self, ident: str, now: float) -> None:
        until = now + self.ttl
        self._until[ident] = until
        self._queue.append((until, ident))

    def has(self, ident: str, now: float) -> bool:
        until = self._until.get(ident)
        return until is not None and until > now

    def expire(self, now: float) -> None:
        queue, until = self._queue, self._until
        while queue and queue[0][0] <= now:
            t, ident = queue.popleft()
            if until.get(ident) == t:  # not claimed again since
                del until[ident]


class _Claims:
    """Claim mode: the held messages of every sort ruleset in one ClaimCache, plus the ID cache."""

    def __init__(self, id_ttl: float, unclaimed_outlink: str):
        self.cache = ClaimCache()
        self.ids = _IdCache(id_ttl)
        self.unclaimed_outlink = unclaimed_outlink
        self._seq = 0  # arrival number: the uplink order of this node's input

    def bake(self, rule: "_ClaimBake", msg: Msg, key: Any, ident: str, now: float) -> list[Emit]:
        self.ids.expire(now)
        self._seq += 1
        processed = self.ids.has(ident, now)
        if self.cache.offer((rule, msg), ident, key, self._seq, now + rule.spec.bake_time, processed):
            return [Emit(BYPASS, (msg,), _NO_INFO)]
        rule.held += 1
        return []

    def claim(self, msg: Msg, key: Any, ident: str, now: float) -> list[Emit]:
        self.ids.expire(now)
        self.ids.add(ident, now)
        self._seq += 1  # everything held arrived before this claim, so all of it may be claimed
        out = self._leave(BYPASS, self.cache.claim(ident, key, upto=self._seq))
        out.append(Emit(NOHIT, (msg,), _NO_INFO))
        return out

    def rollback(self) -> list[Emit]:
        return self._leave(ROLLBACK, self.cache.rollback())

    def deadline(self) -> float | None:
        return self.cache.next_deadline()

    def fire(self, at: float) -> list[Emit]:
        return [Emit(self.unclaimed_outlink, (msg,), _UNCLAIMED_INFO) for _, msg in self.cache.expire(at)]

    def _leave(self, outlink: str, items: list) -> list[Emit]:
        out = []
        for rule, msg in items:
            rule.held -= 1
            out.append(Emit(outlink, (msg,), _NO_INFO))
        return out


class _ClaimBake(_Rule):
    """A sort ruleset in claim mode: bakes until claimed (never, if already processed)."""

    def __init__(self, spec: Ruleset, claims: _Claims):
        super().__init__(spec)
        self._claims = claims

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        return self._claims.bake(self, msg, key, ident, now)


class _Claiming(_Rule):
    """A claim ruleset: each message is an escalation that claims what the master processed."""

    def __init__(self, spec: Ruleset, claims: _Claims):
        super().__init__(spec)
        self._claims = claims

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        return self._claims.claim(msg, key, ident, now)
