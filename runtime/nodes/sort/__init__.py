"""The Sort node: each ruleset's messages leave in key order, as far as its mode promises (after QFlow's SortNode).

Rulesets sort messages into groups: the first ruleset whose ``match`` the
message meets takes it (a ruleset without ``match`` takes every message), and
its ``key`` template gives the sort key, read as the node's ``key_type``. A
message no ruleset takes leaves at once through ``nohit`` (the implicit
``nohit`` ruleset). Each ruleset has its own mode, from ``bake_time`` and
``session_timeout`` (both in seconds):

- static (both 0): nothing is held. A message whose key is above every key
  before it in its ruleset (the first ascending series) leaves through
  ``done``; any other through ``bypass``. ``done`` is strictly ascending.
- session (``bake_time`` 0, ``session_timeout`` > 0): every message is held;
  once the ruleset's cache has not changed for ``session_timeout``, all of
  it leaves through ``done`` in key order. ``done`` ascends within a session.
- bake (``bake_time`` > 0): a message at or below the threshold (the highest
  key the ruleset has flushed) leaves through ``bypass`` at once; others
  bake. The reference message is the longest-baked one; ``bake_time`` after
  it arrived, the highest key among the fully baked messages becomes the
  threshold, every held message at or below it leaves through ``done`` in
  key order, and the longest-baked message left is the next reference.
  ``done`` ascends across sessions (equal keys may repeat).

Claim mode (any ruleset has ``type: claim``; the worker of an active-active
pair). Other rulesets bake until claimed. A message of a claim ruleset is an
escalation from the master: its ID enters the node's ID cache (kept
``id_ttl`` seconds), every held message at or below its key, or with its ID,
leaves through ``bypass`` (in arrival order), and the claiming message
itself through ``nohit``. A message whose ID is in the ID cache is never
baked: it leaves through ``bypass`` at once. A message unclaimed after its
``bake_time`` is surfaced through ``unclaimed_outlink`` (``done``, or
``failure``) yet stays held; a message matching ``rollback_on`` rolls every
held message back through ``rollback`` in arrival order (then leaves
through ``nohit`` itself). See :class:`ClaimCache` and :class:`ClaimSortNode`
(the cluster's claim node, built on the same cache).

The four outlinks may carry any names (``outlinks``: done, bypass, failure,
nohit, in QFlow's order). The cluster's claim pair (a sort with
``pairs_with``) reads its rulesets here too (:func:`read_rulesets` with
``pair=True``: claim mode always) and classifies each uplink message with
``claim_rules.ClaimRules``; both take a ruleset's claim ID from
``Ruleset.claim_id`` (without ``id``, the key's one text: 3 and 3.0 are one
ID under ``key_type: float``). ``xa_mode`` (QFlow's XAMode, per node or per
ruleset) is 1 on both, withheld messages staying in the uplink; 0 is refused
on both with one reason (:data:`XA0_REFUSED`).

The package, by concern: ``claim`` (the claim logic and the cluster's claim
node), ``claim_rules`` (the pair's reading of a message), ``rules``
(rulesets and their modes), ``node`` (the node), ``min_queue``; this module
reads the flow file.

Bad input: a message whose key (or, in claim mode, ID) field is missing or
of the wrong type leaves through ``failure`` with ``info["reason"]`` and
changes nothing. Every message leaves exactly once, through ``done``,
``bypass``, ``nohit``, ``failure`` or ``rollback``; in claim mode the
surfacing of an unclaimed message is a notice and its one exit is still to
come (a claim, or a rollback). ``now`` must not decrease between calls.

>>> from twinflow.runtime.params import Doc, Params
>>> doc = Doc("rulesets:\\n- {name: all, key: '{seq}', bake_time: 2}\\n", "f.yaml")
>>> node = build("sorter", Params(doc, "", doc.value))
>>> for t, n in [(0.0, 5), (0.5, 7), (1.0, 3)]:
...     _ = node.on_message(Msg(f"m{n}", {"seq": n}), now=t)
>>> [(e.outlink, e.msgs[0].id) for e in node.on_time(2.0)]
[('done', 'm3'), ('done', 'm5')]
>>> node.rule_pending()
{'all': 1, 'nohit': 0}
"""

from __future__ import annotations

import re

from ...params import Params
from ..base import Msg  # noqa: F401  (the doctest above uses it)
from .claim import BYPASS, DONE, FAILURE, ClaimCache, ClaimSortNode
from .node import OUTLINKS, SortNode
from .rules import KEY_TYPES, NOHIT, ROLLBACK, Pattern, Ruleset

__all__ = ["BYPASS", "DONE", "FAILURE", "NOHIT", "OUTLINKS", "ROLLBACK", "XA0_REFUSED", "ClaimCache",
           "ClaimSortNode", "KEY_TYPES", "Pattern", "Ruleset", "SortNode", "build", "read_outlink_names",
           "read_rulesets", "read_xa_mode"]


def build(name: str, p: Params) -> SortNode:
    p.only("rulesets", "key_type", "id_ttl", "unclaimed_outlink", "rollback_on", "max_pending", "outlinks", "xa_mode")
    key_type = p.choice("key_type", KEY_TYPES, "int")
    rulesets = read_rulesets(p, key_type)
    claim_mode = any(s.type == "claim" for s in rulesets)
    if not claim_mode:
        for field in ("id_ttl", "unclaimed_outlink", "rollback_on"):
            if p.has(field):
                raise p.error(field, "only in claim mode (a ruleset with type: claim)")
    return SortNode(
        name, rulesets, key_type=key_type,
        id_ttl=p.seconds("id_ttl", 86400.0, positive=True),
        unclaimed_outlink=p.choice("unclaimed_outlink", (DONE, FAILURE), DONE),
        rollback_on=_read_pattern(p.section("rollback_on")) if p.has("rollback_on") else None,
        max_pending=p.integer("max_pending", 1_000_000, minimum=1),
        names=read_outlink_names(p),
    )


def read_rulesets(p: Params, key_type: str, *, pair: bool = False) -> list[Ruleset]:
    """The node's ``rulesets``, each checked against its mode; ``pair``: the cluster's claim
    pair (the worker's half), which is in claim mode whether or not it lists a claim ruleset
    (the master's escalations are its claims). ``xa_mode`` is read alike with or without
    ``pair`` (:func:`read_xa_mode`), so a ruleset replay takes, the cluster takes too."""
    read_xa_mode(p)
    sections = p.sections("rulesets")
    if not sections:
        raise p.error("rulesets", "must list at least one ruleset")
    rulesets: list[Ruleset] = []
    for r in sections:
        spec = _read_ruleset(r, key_type)
        if any(s.name == spec.name for s in rulesets):
            raise r.error("name", f"another ruleset is already named {spec.name!r}")
        rulesets.append(spec)
    claim_mode = pair or any(s.type == "claim" for s in rulesets)
    for r, spec in zip(sections, rulesets):
        _check_mode(r, spec, claim_mode)
    if claim_mode and all(s.type == "claim" for s in rulesets):
        raise p.error("rulesets", "claim mode needs a ruleset of type sort (a baking ruleset: the messages "
                                  "that claims release)")
    return rulesets


def read_outlink_names(p: Params) -> tuple[str, str, str, str]:
    """``outlinks``: the node's own names for done, bypass, failure and nohit, in QFlow's
    order (the first is done, the second bypass, the third failure, the last nohit)."""
    names = tuple(p.str_list("outlinks", list(OUTLINKS[:4])))
    if len(names) != 4:
        raise p.error("outlinks", f"must name exactly four outlinks: done, bypass, failure, nohit in that "
                                  f"order (got {len(names)})")
    if len(set(names)) != 4 or ROLLBACK in names:
        raise p.error("outlinks", f"must be four different names, none of them {ROLLBACK!r} (got {list(names)})")
    return names  # type: ignore[return-value]


# QFlow's XAMode 0 takes withheld messages off the uplink's queue, for a node that must withhold
# more than that queue holds. twinflow's uplink is never trimmed past a message the flow has not
# processed, so it keeps every withheld message for as long as it is withheld (XAMode 1), whatever
# their number; on the cluster both peers read that one uplink, so taking a message off it would
# take it from the master's input too. So 0 is refused, in replay as on the cluster (one flow file
# means one thing on both), never taken and ignored.
XA0_REFUSED = ("xa_mode 0 is refused: the uplink is never trimmed past a message the flow has not processed, "
               "so every withheld message stays in it (xa_mode 1); on the cluster both peers read that one "
               "uplink, and removing a message would remove it from the master's input too")


def read_xa_mode(p: Params) -> int:
    """``xa_mode`` of a sort node or of one of its rulesets: 1 (the default); 0 is refused with
    :data:`XA0_REFUSED`, anything else with what it may be."""
    xa = p.get("xa_mode", int, 1, check=lambda v: v in (0, 1),
               why="must be 1 (withheld messages stay in the uplink); 0 is refused")
    if xa == 0:
        raise p.error("xa_mode", XA0_REFUSED)
    return xa


def _read_ruleset(r: Params, key_type: str) -> Ruleset:
    r.only("name", "match", "key", "key_type", "type", "bake_time", "session_timeout", "id", "xa_mode")
    name = r.name("name")
    if name == NOHIT:
        raise r.error("name", "'nohit' is the implicit ruleset of the messages no ruleset takes")
    if r.has("key_type") and r.get("key_type", str) != key_type:
        raise r.error("key_type", f"must be the node's key_type ({key_type}): every ruleset shares one key "
                                  f"type, so that a claim's key compares with every held key")
    read_xa_mode(r)
    return Ruleset(
        name=name,
        key=r.template("key"),
        match=_read_pattern(r.section("match")) if r.has("match") else None,
        type=r.choice("type", ("sort", "claim"), "sort"),
        bake_time=r.seconds("bake_time", 0.0),
        session_timeout=r.seconds("session_timeout", 0.0),
        id=r.template("id", None),
    )


# A day: a claim that has not come within it will not come (the master is gone, and a promotion
# rolls back what is held); the cluster's ID cache and uplink retention are sized in days.
MAX_CLAIM_BAKE = 86400.0


def _check_mode(r: Params, spec: Ruleset, claim_mode: bool) -> None:
    """Refuse what a ruleset's mode would silently ignore."""
    if spec.type == "claim":
        for field in ("bake_time", "session_timeout", "xa_mode"):
            if r.has(field):
                raise r.error(field, "has no meaning on a claim ruleset (it holds nothing)")
    elif claim_mode:
        if spec.bake_time <= 0:
            raise r.error("bake_time", "claim mode needs bake_time > 0 on every sort ruleset "
                                       "(how long a message waits for its claim)")
        if spec.bake_time > MAX_CLAIM_BAKE:
            raise r.error("bake_time", f"must be seconds in (0, {MAX_CLAIM_BAKE:.0f}] in claim mode")
        if r.has("session_timeout"):
            raise r.error("session_timeout", "has no meaning in claim mode")
    else:
        if spec.id is not None:
            raise r.error("id", "only in claim mode (a ruleset with type: claim)")
        if spec.bake_time > 0 and spec.session_timeout > 0:
            raise r.error("session_timeout", "has no effect when bake_time > 0; set one of the two")


def _read_pattern(m: Params) -> Pattern:
    m.only("field", "equals", "regex")
    field = m.field_path("field")
    if m.has("equals") == m.has("regex"):
        raise m.doc.error(m.path, "needs exactly one of 'equals' or 'regex'")
    if m.has("equals"):
        return Pattern(field, equals=m.get("equals", (str, int, float, bool)))
    text = m.get("regex", str)
    try:
        return Pattern(field, regex=re.compile(text))
    except re.error as exc:
        raise m.error("regex", f"is not a regular expression: {exc}") from None
