"""What a flow file reads of a message, and in which role (:class:`FlowPlan`): the message ID,
the history's uuid, a join's type and activation, the claim pair's rulesets and their keys and
claim IDs, the shard key's fields, a resequence's number and group, a sequence's group and an
aggregate's fields, each found on the way a message takes from ``input``; and
:func:`regex_sample`, a text in which a ruleset's regex is found. :mod:`.flow_messages` makes
messages from the plan.

Under failure: reading a flow raises nothing for what no made-up value can serve (a field read
in two roles that no one value fits, a regex no made-up text satisfies): the plan lists each
such field in ``conflicts`` as :class:`CannotGenerate`, naming the field and why, for the
generator to raise before a message is sent. :func:`regex_sample` gives None rather than a text
its regex does not find; node parameters that cannot be read again as YAML count as none.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..runtime.fields import BadInput, FieldPath, MissingField, Template


class CannotGenerate(ValueError):
    """The flow needs a value at ``field`` that the generator cannot make up (``reason``)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"field '{field}': {reason}")
        self.field, self.reason = field, reason

    def __reduce__(self):  # raised in a simulator's worker process, it crosses to the parent
        return CannotGenerate, (self.field, self.reason)


# Roles a field can have; a field read in two roles must take one value that serves both.
ID, UUID, CLAIM_ID, KEY, KEY_PART, TYPE, GROUP, SHARD = (
    "id", "uuid", "claim-id", "key", "key-part", "type", "group", "shard")
NUMBER, SEQ_GROUP, AGG_TYPE, AGG_ID, AGG_PARENT, AGG_TO, AGG_FINAL, AGG_ACTION = (
    "number", "seq-group", "agg-type", "agg-id", "agg-parent", "agg-recipients", "agg-final", "agg-action")
UNIQUE_ROLES = {ID, UUID, CLAIM_ID, AGG_ID}    # a value of its own per message
FRESH_ROLES = {ID, CLAIM_ID, KEY, AGG_ID}      # a new value in every copy (a sample's, a document sent again)


@dataclass
class FlowField:
    """A field the flow reads: its path, each role it is read in (and by what), and what those
    roles ask of its value."""

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
        self.fields: dict[str, FlowField] = {}
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
    def _role(self, path: str | FieldPath, role: str, what: str, **extra) -> FlowField:
        fp = path if isinstance(path, FieldPath) else FieldPath(path)
        f = self.fields.setdefault(fp.path, FlowField(fp))
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
            elif len(kinds) > 1 and not kinds <= UNIQUE_ROLES | {KEY} and not kinds <= {GROUP, SEQ_GROUP} \
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
