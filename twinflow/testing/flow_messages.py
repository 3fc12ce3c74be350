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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..runtime.fields import BadInput, FieldPath, MissingField, Template
from ..runtime.json_lines import JsonLinesError, json_objects
from .messages import order_or_payment

# A re-sent document's ID is made as message RESEND_BASE + n's would be: never one of the run's own.
RESEND_BASE = 100_000_000
SAMPLES_HINT = ("give example messages with --samples FILE (one JSON object a line; each copy gets a fresh "
                "ID and a growing sort key)")
_CHECKED = 60  # messages made and decoded before a flow's generator is used


class CannotGenerate(ValueError):
    """The flow needs a value at ``field`` that the generator cannot make up (``reason``)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"field '{field}': {reason}")
        self.field, self.reason = field, reason

    def __reduce__(self):  # raised in a simulator's worker process, it crosses to the parent
        return CannotGenerate, (self.field, self.reason)


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


# -- what a flow reads -----------------------------------------------------------------------------
# Roles a field can have; a field read in two roles must take one value that serves both.
ID, UUID, CLAIM_ID, KEY, KEY_PART, TYPE, GROUP, SHARD = (
    "id", "uuid", "claim-id", "key", "key-part", "type", "group", "shard")
NUMBER, SEQ_GROUP, AGG_TYPE, AGG_ID, AGG_PARENT, AGG_TO, AGG_FINAL, AGG_ACTION = (
    "number", "seq-group", "agg-type", "agg-id", "agg-parent", "agg-recipients", "agg-final", "agg-action")
_UNIQUE = {ID, UUID, CLAIM_ID, AGG_ID}    # a value of its own per message
_FRESH = {ID, CLAIM_ID, KEY, AGG_ID}      # a new value in every copy (a sample's, a document sent again)


@dataclass
class _Field:
    path: FieldPath
    roles: dict[str, str] = field(default_factory=dict)  # role -> what reads it (for messages)
    key_types: set[str] = field(default_factory=set)     # KEY, KEY_PART: the key types it is read as
    types: tuple[str, ...] = ()      # TYPE: the join's types
    number_start: int = 0            # NUMBER: the resequence's start
    number_group: str | None = None  # NUMBER: the resequence's group field

    def kinds(self) -> set[str]:
        """Its roles; the shard key's only when it has no other (any value routes)."""
        kinds = set(self.roles)
        return kinds - {SHARD} if len(kinds) > 1 else kinds


@dataclass
class _Target:
    """A ruleset messages are sent to: its match field and the value that matches."""

    name: str
    path: FieldPath | None = None
    value: Any = None


class FlowPlan:
    """What a flow reads, and where: its fields with their roles, its claim rulesets, its join
    groups. ``conflicts`` lists the fields no made-up value can serve (:class:`CannotGenerate`)."""

    def __init__(self, graph):
        self.graph = graph
        cluster = graph.cluster
        self.spec = cluster.message if cluster is not None else graph.message
        self.fields: dict[str, _Field] = {}
        self.conflicts: list[CannotGenerate] = []
        self.group_size, self.primary_types, self.primary_path = 1, (), None
        self.history = False
        self._yaml = self._params()
        self._role(self.spec.id_path, ID, "the message ID (message.id)")
        self.rules = cluster.pair.rules if cluster is not None and cluster.pair is not None else self.spec.claim_rules
        self.targets: list[_Target] = []
        self.nohit_field: list[FieldPath] = []
        if self.rules is not None:
            self._claim_rules()
        joins = []
        for name in self._main_path():
            self._node(name, joins)
        # The joins' groups: the first AND join's types, one of each per activation (else the first join's).
        primary = next((j for j in joins if type(j).__name__ == "AndJoin"), joins[0] if joins else None)
        if primary is not None:
            self.primary_types, self.primary_path = tuple(primary.types), primary.type_field.path
            self.group_size = len(primary.types) if type(primary).__name__ == "AndJoin" else 1
        if cluster is not None and cluster.shard_key and cluster.shards > 1:
            for f in Template(cluster.shard_key).fields:
                self._role(f.path, SHARD, "the shard key (uplink.shard_key)")
        self._check_roles()

    # -- reading the flow --------------------------------------------------------------------------
    def _role(self, path: str | FieldPath, role: str, what: str, **extra) -> _Field:
        fp = path if isinstance(path, FieldPath) else FieldPath(path)
        f = self.fields.setdefault(fp.path, _Field(fp))
        f.roles.setdefault(role, what)
        for k, v in extra.items():
            if k == "key_type":
                f.key_types.add(v)
            else:
                setattr(f, k, v)
        return f

    def _claim_rules(self) -> None:
        rules = self.rules
        for r in rules.rulesets:  # claim rulesets too: their messages (acknowledgements) claim in every group
            self._key_template(r.key, rules.key_type, f"the sort key of ruleset '{r.name}'")
            if r.id is not None:
                for f in r.id.fields:
                    if f.path not in self.fields:
                        self._role(f, CLAIM_ID, f"the claim ID of ruleset '{r.name}'")
            target = _Target(r.name)
            if r.match is not None:
                target.path = r.match.field
                if r.match.regex is not None:
                    sample = regex_sample(r.match.regex)
                    if sample is None:
                        self.conflicts.append(CannotGenerate(
                            r.match.field.path, f"ruleset '{r.name}' matches the regex "
                                                f"{r.match.regex.pattern!r}, which no made-up text satisfies"))
                        continue
                    target.value = sample
                else:
                    target.value = r.match.equals
            self.targets.append(target)
        if all(r.match is not None for r in rules.rulesets):
            self.nohit_field = [r.match.field for r in rules.rulesets]

    def _key_template(self, key: Template, key_type: str, what: str) -> None:
        *parts, last = key.fields
        for f in parts:
            self._role(f, KEY_PART, what, key_type=key_type)
        self._role(last, KEY, what, key_type=key_type)

    def _params(self) -> dict:
        try:
            nodes = (yaml.safe_load(self.graph.text) or {}).get("nodes") or {}
        except yaml.YAMLError:
            nodes = {}
        return {k: v for k, v in nodes.items() if isinstance(v, dict)}

    def _main_path(self) -> list[str]:
        """The nodes a message passes on its way from ``input`` through each node's main outlink."""
        main = {"history": "new", "resequence": "out", "sequence": "out", "aggregate": "complete",
                "sort": "done", "action": "done"}
        out, name = [], self.graph.input
        while name is not None and name not in out and name in self.graph.nodes:
            out.append(name)
            node = self.graph.nodes[name]
            outlink = main.get(node.kind)
            if node.kind == "join":
                outlink = "joined" if type(node).__name__ == "AndJoin" else "passed"
            name = self.graph.links.get(name, {}).get(outlink)
        return out

    def _node(self, name: str, joins: list) -> None:
        node, p = self.graph.nodes[name], self._yaml.get(name, {})
        kind = node.kind
        if kind == "history":
            self.history = True
            self._role(node.uuid_path, UUID, f"the uuid of history '{name}'")
        elif kind == "join":
            joins.append(node)
            self._role(node.type_field, TYPE, f"the type of join '{name}'", types=tuple(node.types))
            if getattr(node, "activation_field", None) is not None:
                self._role(node.activation_field, GROUP, f"the activation of join '{name}'")
        elif kind == "resequence":
            group = p.get("group")
            self._role(str(p["sequence_number"]), NUMBER, f"the sequence number of resequence '{name}'",
                       number_start=int(p.get("start", 0)), number_group=str(group) if group else None)
            if group:
                self._role(str(group), SEQ_GROUP, f"the group of resequence '{name}'")
        elif kind == "sequence":
            if p.get("group"):
                self._role(str(p["group"]), GROUP, f"the group of sequence '{name}'")
        elif kind == "aggregate":
            f = {"type": "type", "message_id": "id", "parent_id": "parent_id", "recipients": "recipients",
                 "final_recipient": "final_recipient", "action": "action", **(p.get("fields") or {})}
            for k, role in (("type", AGG_TYPE), ("message_id", AGG_ID), ("parent_id", AGG_PARENT),
                            ("recipients", AGG_TO), ("final_recipient", AGG_FINAL), ("action", AGG_ACTION)):
                self._role(str(f[k]), role, f"the {k} of aggregate '{name}'")
        elif kind == "sort":
            key_type = str(p.get("key_type", "int"))
            for r in node.rulesets:
                if r.type != "claim":
                    self._key_template(r.key, key_type, f"the sort key of ruleset '{r.name}' of '{name}'")

    def _check_roles(self) -> None:
        """One value per field must serve every role it has; name the fields where none can."""
        match_paths = {t.path.path for t in self.targets if t.path is not None}
        for path, f in self.fields.items():
            kinds = f.kinds()
            if path in match_paths and kinds - {TYPE, SHARD}:
                what = next(iter(f.roles.values()))
                self.conflicts.append(CannotGenerate(path, f"a ruleset of the claim pair matches on it and it is "
                                                           f"also {what}"))
            elif len(kinds) > 1 and not kinds <= _UNIQUE | {KEY} and not kinds <= {GROUP, SEQ_GROUP} \
                    and not kinds <= {KEY, KEY_PART}:
                a, b = sorted(f.roles.values())[:2]
                self.conflicts.append(CannotGenerate(path, f"it is {a} and {b}: no made-up value is both"))

    # -- the flow's needs against a document -----------------------------------------------------------
    def required(self) -> list[FieldPath]:
        """The fields every message must carry (a ruleset's match field aside)."""
        return [f.path for f in self.fields.values()]

    def fits(self, source) -> bool:
        """Whether ``source``'s first messages carry every field the flow reads and decode."""
        from ..runtime.message import decode

        for seq in range(40):
            doc = source.doc(seq)
            for path in self.required():
                try:
                    path.get(doc)
                except MissingField:
                    return False
            try:
                decode(f"1-{seq}", json.dumps(doc).encode(), self.spec)
            except BadInput:
                return False
        return True


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
        self.resends = bool(uuid_kinds) and all(not (k & _FRESH) for k in uuid_kinds)
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

    def _value(self, f: _Field, seq: int) -> Any:
        kinds = f.kinds()
        k, j, lone, _ = self._place(seq)
        if KEY in kinds:  # grows with seq; as zero-padded text where it is text too
            return f"{seq:09d}" if kinds & _UNIQUE or "str" in f.key_types else seq
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
                if f.kinds() & _FRESH:
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
            if f.kinds() & (_FRESH | {UUID}):
                _set(doc, f.path, self._value(f, seq))
        return doc

    def id_of(self, doc: dict) -> str:
        return str(self.id_path.get(doc))

    def resent(self, doc: dict, n: int) -> dict:
        """The same document under a new message ID (and new values wherever the ID is read)."""
        doc = copy.deepcopy(doc)
        for f in self.plan.fields.values():
            if f.kinds() & _FRESH:
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


def regex_sample(rx: re.Pattern) -> str | None:
    """A short text in which ``rx`` is found, made from its parsed form (literals, classes,
    repeats at their least, the first branch), or None when that is beyond this (look-arounds,
    back-references, negated classes) or the text does not match."""
    from re import _parser as sre
    categories = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " ",
                  "CATEGORY_NOT_DIGIT": "a", "CATEGORY_NOT_WORD": "-", "CATEGORY_NOT_SPACE": "a"}

    def one_of(items) -> str | None:
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                return chr(av)
            if name == "RANGE":
                return chr(av[0])
            if name == "CATEGORY":
                return categories.get(str(av))
            return None
        return None

    def text(items) -> str | None:
        out = []
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                piece = chr(av)
            elif name == "NOT_LITERAL":
                piece = "a" if av != ord("a") else "b"
            elif name == "ANY":
                piece = "a"
            elif name == "IN":
                piece = one_of(av)
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                lo, _, sub = av
                inner = text(sub)
                piece = None if inner is None else inner * lo
            elif name == "SUBPATTERN":
                piece = text(av[-1])
            elif name == "ATOMIC_GROUP":
                piece = text(av)
            elif name == "BRANCH":
                piece = text(av[1][0])
            elif name == "AT":
                piece = ""
            elif name == "CATEGORY":
                piece = categories.get(str(av))
            else:
                return None
            if piece is None:
                return None
            out.append(piece)
        return "".join(out)

    try:
        made = text(sre.parse(rx.pattern, rx.flags))
    except Exception:  # an unusual pattern: samples will do
        return None
    return made if made is not None and rx.search(made) else None

