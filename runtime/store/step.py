"""What one master step writes to Redis: outputs, node state, processed IDs, the mark.

A step is a batch of uplink messages (or a timer firing) run through the
flow on the master. Everything it changed is written by one call of the
COMMIT script (``scripts.py``), fenced by the master's epoch: all of it, or
none of it when a newer master exists. A message whose step was committed is
processed (``cluster/master_flow.py`` says what that means per node).

>>> step = Step(mark="5-0", ids=["a"], outputs=[("tf:{f}:sink", {"id": "a"})],
...             state={"join": {"7": {"d": 1.0}, "8": None}})
>>> keys, args = step.script_call(3, FlowKeys("f"), id_ttl=60, token="n1-1")
>>> keys[2:]
['tf:{f}:step:n1-1', 'tf:{f}:version', 'tf:{f}:id:a', 'tf:{f}:sink', 'tf:{f}:state:join']
>>> args[:8]
[3, 60, '5-0', '', 1, '', 'X', 6]

Outputs that share their leading fields (a master's step writes many to one
stream, each from the same node, epoch, outlink and time) go as one run: the
shared fields once, then each output's own values, so neither this process
nor Redis handles the shared ones per output.

>>> head = SharedFields("tf:{f}:sink", ("from", "a", "outlink", "done"), ("id", "data"))
>>> step = Step(outputs=[head.output(("m1", "{}")), head.output(("m2", "{}"))])
>>> step.script_call(3, FlowKeys("f"), id_ttl=60, token="n1-1")[1][6:]
['R', 5, 2, 'from', 'a', 'outlink', 'done', 2, 'id', 'data', 2, 'm1', '{}', 'm2', '{}']
>>> output_fields(step.outputs[1])
{'from': 'a', 'outlink': 'done', 'id': 'm2', 'data': '{}'}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..json_text import compact
from .flow_keys import FlowKeys

# How many steps the change log keeps (about: trimmed with MAXLEN ~). A worker that falls
# further behind than this loads the state whole again (cluster/warm_state.py); each entry
# holds one step's history changes, about 60 bytes per message.
CHANGE_LOG_STEPS = 256
# Fields of one state hash set by one HSET (or deleted by one HDEL) of the COMMIT script
# (Lua's unpack has a limit).
_HASH_FIELDS = 512


class SharedFields:
    """The leading fields that outputs to one ``stream`` share, and the names of each one's own.

    An output made with :meth:`output` is ``(stream, shared, values)``; consecutive ones
    with the same ``SharedFields`` object are written as one run (see the module doc).
    """

    __slots__ = ("stream", "pairs", "names")

    def __init__(self, stream: str, pairs: tuple, names: tuple):
        self.stream, self.pairs, self.names = stream, pairs, names

    def output(self, values: tuple) -> tuple:
        return (self.stream, self, values)


def output_fields(output: tuple) -> dict:
    """An output's fields, in order, whichever form it has: ``(stream, fields)`` or a shared run's."""
    if len(output) == 2:
        return dict(output[1])
    _, shared, values = output
    fields = dict(zip(shared.pairs[::2], shared.pairs[1::2]))
    fields.update(zip(shared.names, values))
    return fields

@dataclass
class Step:
    mark: str | None = None                                              # last uplink position handled
    ids: list[str] = field(default_factory=list)                         # processed message IDs
    outputs: list[tuple] = field(default_factory=list)  # (stream key, fields) or SharedFields.output(), in order
    state: dict[str, dict[str, Any]] = field(default_factory=dict)       # node -> key -> entry or None
    version: int | None = None   # the state version the step was computed from (None: not checked)
    # The nodes whose state changes go to the change log as well (empty: the flow keeps none).
    logged: tuple[str, ...] = ()
    # Action nodes whose suspension the step began (-> its record as JSON text) or ended (-> None).
    suspended: dict[str, str | None] = field(default_factory=dict)
    # The history's Duplicate and In Doubt verdicts, logged once the step is committed (not written).
    journal: list[dict] = field(default_factory=list)
    # What the step records beside its outputs (audit entries, resubmit outcomes, notices), in
    # order: ("X", stream, fields) an XADD; ("M", hash, fields) an HSET; ("N", stream,
    # publisher key or "", counter key, cap, fields) a notice (scripts.COMMIT, 'N').
    records: list[tuple] = field(default_factory=list)

    def empty(self) -> bool:
        return (self.mark is None and not self.ids and not self.outputs and not any(self.state.values())
                and not self.suspended and not self.records)

    def script_call(self, epoch: int, keys: FlowKeys, id_ttl: int, token: str,
                    guess: tuple[str | None] | None = None) -> tuple[list[str], list]:
        """KEYS and ARGV of the COMMIT script; ``token`` names this step (unique per step, the
        same for every retry of it). ``guess``, a 1-tuple of the processed mark the writer
        assumes (None: no mark yet), makes the step apply only if that guess holds (scripts.COMMIT)."""
        script_keys = [keys.epoch, keys.processed, keys.step(token), keys.version,
                       *(keys.id_prefix + i for i in self.ids)]
        index: dict[str, int] = {}

        def key(name: str) -> int:
            if name not in index:
                script_keys.append(name)
                index[name] = len(script_keys)  # Lua counts from 1
            return index[name]

        guard = "" if guess is None else "=" + (guess[0] or "")
        args: list = [epoch, id_ttl, self.mark or "", guard, len(self.ids),
                      "" if self.version is None else self.version]
        outputs, i = self.outputs, 0
        while i < len(outputs):
            out = outputs[i]
            if len(out) == 2:
                stream, fields = out
                args += ["X", key(stream), len(fields)]
                for f, v in fields.items():
                    args += [f, v]
                i += 1
                continue
            shared = out[1]
            j = i + 1
            while j < len(outputs) and len(outputs[j]) == 3 and outputs[j][1] is shared:
                j += 1
            args += ["R", key(shared.stream), len(shared.pairs) // 2, *shared.pairs, len(shared.names),
                     *shared.names, j - i]
            for out in outputs[i:j]:
                args += out[2]
            i = j
        for record in self.records:
            fields = [x for pair in record[-1].items() for x in pair]
            if record[0] == "N":
                _, stream, publisher, counter, cap, _ = record
                args += ["N", key(stream), key(publisher) if publisher else 0, key(counter), cap,
                         len(fields) // 2, *fields]
            else:
                args += [record[0], key(record[1]), len(fields) // 2, *fields]
        for node, entries in self.state.items():
            if not entries:
                continue
            k = key(keys.state(node))
            sets: list = []
            gone: list = []
            for name, value in entries.items():
                if value is None:
                    gone.append(name)
                else:
                    sets += [name, compact(value)]
            for at in range(0, len(sets), 2 * _HASH_FIELDS):
                chunk = sets[at:at + 2 * _HASH_FIELDS]
                args += ["M", k, len(chunk) // 2, *chunk]
            for at in range(0, len(gone), _HASH_FIELDS):
                chunk = gone[at:at + _HASH_FIELDS]
                args += ["E", k, len(chunk), *chunk]
        if self.suspended:
            k = key(keys.suspended)
            began = [x for node, record in self.suspended.items() if record is not None for x in (node, record)]
            ended = [node for node, record in self.suspended.items() if record is None]
            if began:
                args += ["M", k, len(began) // 2, *began]
            if ended:
                args += ["E", k, len(ended), *ended]
        if self.logged:
            # Every step, changes or not: the log's versions then run without a gap.
            fields = ["t", token]
            for node in self.logged:
                entries = self.state.get(node)
                if entries:
                    fields += [node, compact(entries)]
            args += ["L", key(keys.changes), CHANGE_LOG_STEPS, len(fields) // 2, *fields]
        return script_keys, args
