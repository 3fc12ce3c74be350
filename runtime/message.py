"""Messages as the flow sees them, decoded from uplink entries.

An uplink entry carries one JSON document in its ``data`` field. The flow
file names where the message ID and the sort key live in it. Decoding never
raises anything but :class:`BadInput`, whatever the entry holds (any bytes,
or something that is not bytes at all); its ``reason`` is what the failure
outlink records, and the flow goes on with the next message.

Anyone who can publish to the uplink chooses these bytes, so the body is
bounded BEFORE it is parsed: at most ``max_bytes`` bytes, nesting of arrays
and objects at most ``max_depth`` levels deep (the parser recurses once a
level), and no number literal with more than ``max_number_digits`` digits
(Python refuses to convert an integer of over 4,300 digits, and converts long
ones in quadratic time). Brackets and digits inside JSON strings do not count.

Text that cannot be written: JSON lets a string hold a lone UTF-16
surrogate (``"\\ud800"``), which no UTF-8 encoder accepts, so a key or
an output built from it would fail in Redis (and fail again on every retry,
catch-up and promotion). Such a message is bad input here, whichever field
holds the text (the ID, a join's activation, a group key, a field no node
reads but that leaves the flow with the message), so no node and no Redis
key ever sees it. Bodies must be well-formed UTF-8 (or UTF-16/32) for the
same reason: encoded surrogates are refused.

>>> decode("1-0", b'{"id": "\\\\ud800"}', MessageSpec()).id
Traceback (most recent call last):
...
twinflow.runtime.fields.BadInput: a text in the message is not valid Unicode (a lone surrogate '\\ud800')
>>> decode("1-0", b'{"id": "a", "face": "\\\\ud83d\\\\ude00"}', MessageSpec()).doc["face"] == "\\U0001F600"
True

Resubmits: a body whose top level has the reserved key ``twinflow_resubmit``
is a resubmit envelope (``runtime/resubmit.py``), decoded as a
:class:`Resubmitted` message: the inner document under an identity and a claim
ID of its own, or BadInput naming what is wrong with the envelope.

IDs: an ID is its text. The ID field may hold a non-empty string or an
integer, and the integer ``1`` and the string ``"1"`` are the same ID, so a
producer that switches between the two encodings can never have one message
fed twice. (``"01"`` is a different ID from ``1``: only the decimal text of
the integer counts.) Integer IDs are bounded like every number, by
``max_number_digits``.

>>> spec = MessageSpec(id_path="id", key_path="seq", key_type="int")
>>> m = decode("1700000000000-0", b'{"id": "a1", "seq": 7}', spec)
>>> (m.id, m.key, m.position, m.rule, m.cid)
('a1', 7, '1700000000000-0', 'all', 'a1')
>>> decode("1-0", b'{"id": 1, "seq": 7}', spec).id == decode("1-1", b'{"id": "1", "seq": 7}', spec).id
True
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import accumulate
from typing import Any

from .fields import BadInput, FieldPath, MissingField
from .json_text import LONG_RUN, loads_known
from .sort_keys import parse_key
from .nodes.base import Msg
from . import resubmit


MAX_REASON = 200  # characters of a reason taken from a value or an exception
_RESUBMIT_KEY = resubmit.KEY  # the reserved top-level key of a resubmit envelope (runtime/resubmit.py)


def _clip(text: str, limit: int = MAX_REASON) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _show(raw: Any) -> str:
    """``repr(raw)`` short enough for a reason (a bad value may be kilobytes long)."""
    if isinstance(raw, str) and len(raw) > MAX_REASON:
        return f"{raw[:40]!r}... ({len(raw)} characters)"
    return _clip(repr(raw), 80)


@dataclass(frozen=True)
class MessageSpec:
    """Where a message keeps its ID and sort key, and how large it may be.

    ``max_depth`` is the deepest nesting of arrays and objects allowed (the
    top-level object is level 1); ``max_number_digits`` the most digits a JSON
    number literal may have (sign, point and exponent marks not counted).
    """

    id_path: str = "id"
    key_path: str | None = None   # the claim pair's short form: its one sort key field
    key_type: str = "int"
    id_ttl: int = 7 * 86400       # seconds a processed ID is remembered
    max_bytes: int = 1 << 20
    max_depth: int = 64
    max_number_digits: int = 100
    # The claim pair's rulesets (runtime/nodes/sort/claim_rules.ClaimRules); None: the short
    # form of key_path, or no pair at all when that is None too.
    rules: Any = None

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_number_digits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")

    @cached_property
    def claim_rules(self) -> Any:
        """How decode reads each message's ruleset, key and claim ID, or None without a pair."""
        if self.rules is not None or self.key_path is None:
            return self.rules
        from .nodes.sort.claim_rules import ClaimRules  # the pure core's sort package, read late
        # bake_time only matters to the worker's node, which takes it from the flow's ClaimPair.
        return ClaimRules.short_form(self.key_path, self.key_type, self.id_path, bake_time=1.0,
                                     max_digits=self.max_number_digits)

    def parse_key(self, raw: Any) -> Any:
        """The sort key as ``key_type`` (see ``runtime/sort_keys.py``); raises BadInput when it is not one."""
        return parse_key(self.key_type, raw, self.max_number_digits)


# Not frozen: a frozen dataclass sets each field through object.__setattr__, about 1.2 µs more
# per message decoded (measured); nothing assigns a field after construction, and the hash is
# the one frozen gave (its fields but the document).
@dataclass(slots=True, unsafe_hash=True)
class Message:
    id: str
    key: Any       # the claim pair's sort key; None when the flow has no pair, or no ruleset takes it
    position: str  # the uplink entry ID
    body: bytes
    doc: dict = field(default_factory=dict, compare=False, repr=False)
    rule: str | None = None  # the claim pair's ruleset that takes it; None: no pair, or nohit
    cid: str | None = None   # its claim ID under that ruleset (the ruleset's id template, or the key)

    def msg(self) -> Msg:
        """The message as the flow's nodes take it."""
        return Msg(self.id, self.doc)


@dataclass(slots=True, unsafe_hash=True)
class Resubmitted(Message):
    """A failed message an operator resubmitted (``runtime/resubmit.py``): ``id`` (what the ID
    cache, the processed mark and claims track) is distinct per audit entry, the nodes get
    ``original_id`` and the document (``msg()``), and the master feeds it at ``node`` ("" : the
    flow's input). ``cid`` carries the same suffix, so its claim is its own too."""

    original_id: str = field(default="", compare=False)
    audit: str = field(default="", compare=False)   # the audit entry it was resubmitted from
    node: str = field(default="", compare=False)

    def msg(self) -> Msg:
        return Msg(self.original_id, self.doc)


# -- bounds checked before parsing -------------------------------------------------
#
# All checks run on UTF-8 bytes, where an ASCII byte is always that ASCII
# character (no multi-byte sequence contains one). They go from cheap to exact:
#   1. count '[', '{' and digits anywhere (one C-speed translate): when there are
#      few, neither bound can be exceeded - the common case stops here;
#   2. nesting: openers counted alone; numbers: a regex search for a run of more
#      than max_number_digits number characters (both C speed);
#   3. only when those cannot rule a problem out, the exact measure with JSON
#      strings blanked out, so brackets and digits inside strings do not count.
# The exact measures are upper bounds of what json.loads meets before it stops:
# it reads left to right, and up to the point where it fails, it sees strings
# where step 3 does.

_UTF8 = frozenset({"utf-8", "utf-8-sig"})
# A \uD800-\uDFFF escape: only a body with one can hold a lone surrogate after
# parsing (the bytes themselves are decoded strictly, so none comes from them).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# Step 1 and the long-integer test of json_text.loads in one C pass: a digit becomes "0", an
# opener "[", any other byte " "; then two counts, and a run of LONG_RUN digits is a substring.
_CLASSES = bytes(0x30 if 0x30 <= c <= 0x39 else 0x5B if c in b"[{" else 0x20 for c in range(256))
_LONG_RUN = b"0" * LONG_RUN
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_NUMBER_CHARS = b"-+.eE0123456789"
_NUMBER_MARKS = b"-+.eE"
# '[' and '{' become +1, ']' and '}' become -1 (as signed bytes): nesting is the maximum prefix sum.
_DEPTH_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
# A JSON string, escapes included; an unterminated one runs to the end (linear time,
# no backtracking, whatever the input).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)


@lru_cache(maxsize=16)
def _long_run(max_digits: int) -> re.Pattern[bytes]:
    """A maximal run of more than ``max_digits`` number characters.

    The look-behind starts a match only where a run starts, so a search is
    linear in the input, not quadratic in the length of the runs.
    """
    chars = re.escape(_NUMBER_CHARS).decode()
    return re.compile(rf"(?<![{chars}])[{chars}]{{{max_digits + 1},}}".encode())


def _nesting(bare: bytes) -> int:
    steps = bare.translate(_DEPTH_STEPS, _NOT_BRACKETS)
    return max(accumulate(memoryview(steps).cast("b")), default=0)


def _check_bounds(raw: bytes, spec: MessageSpec, openers: int, digits: int) -> None:
    """Raise BadInput when ``raw`` nests deeper or holds a longer number than ``spec`` allows.

    ``decode`` does step 1 (``openers`` and ``digits`` are its counts) and calls this only
    when step 1 cannot rule a problem out.
    """
    max_depth, max_digits = spec.max_depth, spec.max_number_digits
    deep = openers > max_depth
    long_run = _long_run(max_digits)
    long = digits > max_digits and long_run.search(raw) is not None
    if not (deep or long):
        return
    bare = _STRING.sub(b'""', raw)
    if deep and _nesting(bare) > max_depth:
        raise BadInput(f"nesting deeper than {max_depth} levels")
    if long:
        for run in long_run.finditer(bare):
            if len(run[0].translate(None, _NUMBER_MARKS)) > max_digits:
                raise BadInput(f"a number longer than {max_digits} digits")


def decode(position: str, data: bytes | None, spec: MessageSpec) -> Message:
    """Decode one uplink entry, or raise BadInput with the reason.

    Total: whatever ``data`` is, the only exception is BadInput. ``data`` may
    be any bytes-like object; the body is JSON in UTF-8 (or UTF-16/32, detected
    as ``json.loads`` does), bounded by ``spec`` before it is parsed.

    The ID is its text: an integer ID and its decimal text are the same ID
    (``1`` and ``"1"`` give ``"1"``), so a producer that switches encodings
    cannot feed a message twice; integer IDs are bounded by ``max_number_digits``.
    """
    try:
        if data is None:
            raise BadInput("uplink entry has no 'data' field")
        if not isinstance(data, bytes):
            try:
                view = memoryview(data)
            except TypeError:
                raise BadInput(f"body is a {type(data).__name__}, not bytes") from None
            if view.nbytes > spec.max_bytes:
                raise BadInput(f"message is {view.nbytes} bytes, over the limit of {spec.max_bytes}")
            data = view.tobytes()
        if len(data) > spec.max_bytes:
            raise BadInput(f"message is {len(data)} bytes, over the limit of {spec.max_bytes}")
        # What json.loads(bytes) does, with a fast path for the usual '{' in UTF-8.
        encoding = "utf-8" if data.startswith(b"{") and data[1:2] != b"\x00" else json.detect_encoding(data)
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise BadInput(f"body is not JSON: not {encoding} text ({exc.reason} at byte {exc.start})") from None
        raw = data if encoding in _UTF8 else text.encode("utf-8")
        classes = raw.translate(_CLASSES)  # step 1 of the bounds, inline
        digits, openers = classes.count(b"0"), classes.count(b"[")
        if openers + digits > spec.max_depth or openers + digits > spec.max_number_digits:
            _check_bounds(raw, spec, openers, digits)
        try:  # the usual UTF-8 body through orjson, exactly as json.loads reads it (json_text.loads)
            if encoding == "utf-8":
                doc = loads_known(raw, digits >= LONG_RUN and _LONG_RUN in classes)
            else:
                doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise BadInput("body is not a JSON object")
        if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw):
            _refuse_lone_surrogates(doc)
        if _RESUBMIT_KEY in doc:
            return _resubmitted(position, data, doc, spec)
        msg_id = _message_id(doc, spec)
        rules = spec.claim_rules
        claim = rules.classify(doc, msg_id) if rules is not None else None
        if claim is None:
            return Message(msg_id, None, position, data, doc)  # positional: a third cheaper (measured)
        return Message(msg_id, claim[1], position, data, doc, claim[0], claim[2])
    except BadInput:
        raise
    except Exception as exc:  # the backstop: one bad message must never stop the peer
        raise BadInput(_clip(f"message cannot be decoded: {type(exc).__name__}: {exc}")) from exc


def _message_id(doc: dict, spec: MessageSpec) -> str:
    """The message ID of ``doc`` as text; BadInput when the ID field is missing or not an ID."""
    try:
        raw_id = _path(spec.id_path).get(doc)
    except MissingField:
        raise BadInput(f"message has no ID field '{spec.id_path}'") from None
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or raw_id == "":
        # The rare cases sorted out only here, off the hot path: "" is a string, so saying
        # it is not one would send the producer looking for the wrong fault.
        if raw_id == "":
            raise BadInput(f"ID field '{spec.id_path}' is empty")
        raise BadInput(f"ID field '{spec.id_path}' is not a non-empty string or integer")
    return str(raw_id)


def _resubmitted(position: str, data: bytes, envelope: dict, spec: MessageSpec) -> Resubmitted:
    """A resubmit envelope's message: read from the inner document (its ID, its claim pair's
    ruleset and key), under an identity and a claim ID of its own (``runtime/resubmit.py``)."""
    audit, node, message_id, doc = resubmit.read_envelope(envelope)
    original = message_id if message_id is not None else _message_id(doc, spec)
    rules = spec.claim_rules
    claim = rules.classify(doc, original) if rules is not None else None
    suffix = resubmit.SEPARATOR + audit
    if claim is None:
        return Resubmitted(original + suffix, None, position, data, doc, None, None, original, audit, node)
    return Resubmitted(original + suffix, claim[1], position, data, doc, claim[0], claim[2] + suffix,
                       original, audit, node)


def _refuse_lone_surrogates(doc: dict) -> None:
    """Raise BadInput when any text of ``doc`` (a key or a value) holds a lone surrogate.

    A surrogate pair in a body becomes one character when parsed; only a lone
    one is left as a surrogate, and the standard library writes every text of
    the document out (ensure_ascii off) in C, so one regex search finds it.
    """
    lone = _LONE_SURROGATE.search(json.dumps(doc, ensure_ascii=False, check_circular=False))
    if lone:
        raise BadInput(f"a text in the message is not valid Unicode (a lone surrogate {lone[0]!r})")


@lru_cache(maxsize=64)
def _path(path: str) -> FieldPath:
    return FieldPath(path)
