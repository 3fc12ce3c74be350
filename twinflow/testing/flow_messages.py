"""Messages for any flow, built from the flow file's own field paths: what ``twinflow simulate
--flow`` and ``twinflow drill --flow`` publish.

The built-in kinds publish :func:`~.messages.order_or_payment` (fields ``id``, ``uuid``,
``type``, ``order_id``, ``seq``). A flow that names its fields otherwise gets messages
made from what it reads (:func:`messages_for`):

- the message ID (``message.id``, a dotted path: ``mid``, ``meta.id``): ``m000000``,
  ``m000001``, ... (nested paths become nested objects);
- the history's ``uuid``: one per message (``doc-7``), except that one group in ten ends
  with the document of its first message again under a new ID (the history's
  ``duplicate``);
- the first AND join on the way from ``input`` (or the first join): its types in turn on
  its ``type_field``, one group of all its types per activation on its
  ``activation_field`` (an integer), one group in ten missing its last type (it expires);
- the claim pair's rulesets (``rulesets``, or the short form ``key``): message ``n``
  goes to ruleset ``n mod R`` (baking and claim rulesets alike) (its ``match`` field set to the ruleset's
  ``equals``, or to a string made from its ``regex``), and, when every ruleset has a
  ``match``, one in ``R + 1`` matches none (``nohit``); every key field holds a value
  that grows with the message number, of the pair's ``key_type``; a claim ID template's
  own fields a unique text;
- the shard key template's fields (``uplink.shard_key``): the message's group, so the
  messages that meet in a join share a shard, and groups spread over the shards;
- a sort node's key fields, a resequence's number and group, a sequence's group and an
  aggregate's fields (an original, then a DSN that completes it) on the way.

Where a flow needs a value the generator cannot make up (a regex it cannot satisfy, one
field read as two things, such as a ruleset's ``equals`` on the sort key), it says which
field (:class:`CannotGenerate`); example messages then do (``--samples FILE``, a JSON
object a line: :func:`read_samples`): message ``n`` is sample ``n mod S`` with a fresh ID,
a growing value in each sort key field, a fresh claim ID and history uuid.

When the built-in messages already carry every field the flow reads, they are used as
they are, so a flow file of the built-in kinds runs exactly as its kind does.

What a flow reads, and in which role, is found by :class:`~.flow_plan.FlowPlan`.

>>> from twinflow.runtime.flowgraph import parse_graph
>>> flow = parse_graph('''
... flow: f
... uplink: {stream: up, shards: 2, shard_key: "{oid}"}
... message: {id: meta.id}
... input: out
... nodes:
...   out: {type: action, sink: {stream: sink}}
...   claims: {type: sort, pairs_with: out, key: n, bake_time: 5}
... ''')
>>> m = messages_for(flow)
>>> m.doc(3), m.id_of(m.doc(3))
({'meta': {'id': 'm000003'}, 'n': 3, 'oid': 3}, 'm000003')
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from ..runtime.fields import BadInput, FieldPath
from ..runtime.json_lines import JsonLinesError, json_objects
from .flow_plan import (AGG_ACTION, AGG_FINAL, AGG_ID, AGG_PARENT, AGG_TO, AGG_TYPE, CLAIM_ID, FRESH_ROLES, GROUP, ID,
                        KEY, KEY_PART, NUMBER, SEQ_GROUP, SHARD, TYPE, UNIQUE_ROLES, UUID, CannotGenerate, FlowField,
                        FlowPlan)
from .messages import order_or_payment

# A re-sent document's ID is made as message RESEND_BASE + n's would be: never one of the run's own.
RESEND_BASE = 100_000_000
SAMPLES_HINT = ("give example messages with --samples FILE (one JSON object a line; each copy gets a fresh "
                "ID and a growing sort key)")
_CHECKED = 60  # messages made and decoded before a flow's generator is used


class SamplesError(ValueError):
    """A samples file that cannot be used: its line and the reason."""


class ChainedMessages:
    """The built-in kinds' messages (:func:`order_or_payment`), exactly as they always were."""

    name = "orders and payments"
    resends = True

    def doc(self, seq: int) -> dict:
        return order_or_payment(seq)

    def id_of(self, doc: dict) -> str:
        return doc["id"]

    def resent(self, doc: dict, n: int) -> dict:
        """Re-send ``n`` of ``doc``: the same document under a new message ID."""
        return {**doc, "id": f"r{n:05d}"}


CHAINED_MESSAGES = ChainedMessages()


# -- making them -----------------------------------------------------------------------------------
class FlowMessages:
    """Message ``seq`` of a flow, from its :class:`FlowPlan` or from ``samples`` (see the
    module docstring). Raises CannotGenerate when the flow needs what it cannot make up."""

    name = "messages made from the flow's fields"

    def __init__(self, graph, samples: list[dict] | None = None, plan: FlowPlan | None = None):
        self.plan = plan or FlowPlan(graph)
        self.samples = [copy.deepcopy(s) for s in samples] if samples else None
        self.id_path = FieldPath(self.plan.spec.id_path)
        uuid_kinds = [f.kinds() for f in self.plan.fields.values() if UUID in f.roles]
        # A document can be sent again under a new ID only when its history uuid is not renewed with the ID.
        self.resends = bool(uuid_kinds) and all(not (k & FRESH_ROLES) for k in uuid_kinds)
        if self.samples is None:
            if self.plan.conflicts:
                raise self.plan.conflicts[0]
            self._check()
        else:
            self._check_samples()
        if self.samples is not None:
            self.name = f"{len(self.samples)} samples"

    # -- values ---------------------------------------------------------------------------------------
    def _place(self, seq: int) -> tuple[int, int, bool, int | None]:
        """(group, position in it, alone, message whose document this one sends again)."""
        g = self.plan.group_size
        k, j = divmod(seq, g)
        lone = g > 1 and j == g - 1 and k % 10 == 9
        again = None
        if self.plan.history and self.resends and j == g - 1 and k % 10 == 4:
            again = seq - (g - 1) if g > 1 else seq - 1
        return k, j, lone, again

    def _value(self, f: FlowField, seq: int) -> Any:
        kinds = f.kinds()
        k, j, lone, _ = self._place(seq)
        if KEY in kinds:  # grows with seq; as zero-padded text where it is text too
            return f"{seq:09d}" if kinds & UNIQUE_ROLES or "str" in f.key_types else seq
        if KEY_PART in kinds:  # a key template's other fields: the same text in every key
            return "k" if "str" in f.key_types else 1
        for role, made in ((ID, f"m{seq:06d}"), (AGG_ID, f"a{seq:06d}"), (UUID, f"doc-{seq}"), (CLAIM_ID, f"c{seq}")):
            if role in kinds:
                return made
        if TYPE in kinds:
            if f.path.path != self.plan.primary_path:
                return f.types[(j if self.plan.group_size > 1 else seq) % len(f.types)]
            types = self.plan.primary_types
            return types[0] if lone else types[j] if self.plan.group_size > 1 else types[seq % len(types)]
        if kinds & {GROUP, SHARD}:  # one value per group (a join's activation), its own for one alone
            return -(k + 1) if lone else k
        if SEQ_GROUP in kinds:
            return f"g{seq}"
        if NUMBER in kinds:
            group = self.plan.fields.get(f.number_group) if f.number_group else None
            if group is None:
                return f.number_start + seq          # one sequence of every message
            return f.number_start + (j if GROUP in group.kinds() else 0)
        if AGG_TYPE in kinds:  # an original, then a DSN that completes it under every rule
            return "IMF" if seq % 2 == 0 else "DSN"
        if AGG_TO in kinds:
            return f"r{seq // 2}@example.org"
        if AGG_FINAL in kinds:
            return f"rfc822; r{seq // 2}@example.org"
        if AGG_ACTION in kinds:
            return "failed"
        if AGG_PARENT in kinds:
            ident = next((g for g in self.plan.fields.values() if AGG_ID in g.roles), None)
            return None if ident is None else self._value(ident, seq - seq % 2)
        return f"v{seq}"

    def _made(self, seq: int) -> dict:
        _, _, _, again = self._place(seq)
        if again is not None:
            doc = self._made(again)
            for f in self.plan.fields.values():
                if f.kinds() & FRESH_ROLES:
                    _set(doc, f.path, self._value(f, seq))
            return doc
        doc: dict = {}
        for f in self.plan.fields.values():
            _set(doc, f.path, self._value(f, seq))
        self._aim(doc, seq)
        return doc

    def _aim(self, doc: dict, seq: int) -> None:
        """Send message ``seq`` to its ruleset in turn, or to none (nohit)."""
        targets = self.plan.targets
        if not targets:
            return
        nohit = bool(self.plan.nohit_field)
        turn = seq % (len(targets) + nohit)
        if turn == len(targets):
            for path in self.plan.nohit_field:
                if path.path not in self.plan.fields or self.plan.fields[path.path].kinds() == {SHARD}:
                    _drop(doc, path)
            return
        t = targets[turn]
        if t.path is not None and (t.path.path not in self.plan.fields or
                                   self.plan.fields[t.path.path].kinds() == {SHARD}):
            _set(doc, t.path, t.value)

    def doc(self, seq: int) -> dict:
        if self.samples is None:
            return self._made(seq)
        doc = copy.deepcopy(self.samples[seq % len(self.samples)])
        for f in self.plan.fields.values():
            if f.kinds() & (FRESH_ROLES | {UUID}):
                _set(doc, f.path, self._value(f, seq))
        return doc

    def id_of(self, doc: dict) -> str:
        return str(self.id_path.get(doc))

    def resent(self, doc: dict, n: int) -> dict:
        """The same document under a new message ID (and new values wherever the ID is read)."""
        doc = copy.deepcopy(doc)
        for f in self.plan.fields.values():
            if f.kinds() & FRESH_ROLES:
                _set(doc, f.path, self._value(f, RESEND_BASE + n))
        return doc

    # -- checks --------------------------------------------------------------------------------------
    def _check(self) -> None:
        """Make and decode the first messages: each must decode, IDs must differ, and each
        ruleset's keys grow; else the field at fault (CannotGenerate)."""
        from ..runtime.message import decode

        ids, last, hits = set(), {}, 0
        for seq in range(_CHECKED):
            doc = self.doc(seq)
            try:
                m = decode(f"1-{seq}", json.dumps(doc).encode(), self.plan.spec)
            except BadInput as exc:
                raise CannotGenerate(self._field_of(str(exc)), str(exc)) from None
            if m.id in ids:
                raise CannotGenerate(self.id_path.path, f"message {seq}'s ID {m.id!r} is not new")
            ids.add(m.id)
            if m.rule is not None:
                hits += 1
                if m.rule in last and not m.key > last[m.rule]:
                    field_ = next((r.key.fields[-1].path for r in self.plan.rules.rulesets if r.name == m.rule), "?")
                    raise CannotGenerate(field_, f"ruleset '{m.rule}''s keys do not grow ({last[m.rule]!r}, "
                                                 f"then {m.key!r})")
                last[m.rule] = m.key
        if self.plan.rules is not None and not hits:
            path = next((t.path.path for t in self.plan.targets if t.path is not None), self.id_path.path)
            raise CannotGenerate(path, "no made-up message matches a baking ruleset of the claim pair")

    def _field_of(self, reason: str) -> str:
        """The field a decode error names: a field path, or the key field of the ruleset it names."""
        m = re.search(r"field '([^']+)'", reason)
        if m:
            return m.group(1)
        m = re.search(r"ruleset '([^']+)'", reason)
        rules = self.plan.rules.rulesets if self.plan.rules is not None else ()
        return next((r.key.fields[-1].path for r in rules if m and r.name == m.group(1)), self.id_path.path)

    def _check_samples(self) -> None:
        from ..runtime.message import decode

        for i in range(len(self.samples)):
            try:
                decode(f"1-{i}", json.dumps(self.doc(i)).encode(), self.plan.spec)
            except BadInput as exc:
                raise SamplesError(f"sample {i + 1} (with its fresh ID and key): {exc}") from None


def messages_for(graph, samples: list[dict] | None = None):
    """What a run of ``graph`` publishes: the built-in orders and payments when they carry every
    field the flow reads (and no samples are given), else :class:`FlowMessages`. Raises
    CannotGenerate (or SamplesError) when neither can serve."""
    plan = FlowPlan(graph)
    if not samples and plan.fits(CHAINED_MESSAGES):
        return CHAINED_MESSAGES
    return FlowMessages(graph, samples, plan)


def read_samples(path: str | Path) -> list[dict]:
    """The example messages of a samples file: one JSON object a line (blank lines skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise SamplesError(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        out = json_objects(lines, str(path))
    except JsonLinesError as exc:
        raise SamplesError(str(exc)) from None
    if not out:
        raise SamplesError(f"{path}: no samples (one JSON object a line)")
    return out


# -- helpers ---------------------------------------------------------------------------------------
def _set(doc: dict, path: FieldPath, value: Any) -> None:
    node = doc
    for part in path.parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path.parts[-1]] = value


def _drop(doc: dict, path: FieldPath) -> None:
    node = doc
    for part in path.parts[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(path.parts[-1], None)
