"""Decoding uplink entries: good ones, and every kind of bad one with its reason."""

import json
import time

import pytest
from hypothesis import given, settings, strategies as st

from twinflow.runtime import message as message_module
from twinflow.runtime.fields import BadInput
from twinflow.runtime.message import Message, MessageSpec, decode
from twinflow.runtime.positions import position_order
SPEC = MessageSpec(id_path="meta.id", key_path="seq", key_type="int", max_bytes=200)


def test_decodes_nested_id_and_typed_key():
    m = decode("5-1", b'{"meta": {"id": 42}, "seq": "7"}', SPEC)
    assert (m.id, m.key, m.position) == ("42", 7, "5-1")


@pytest.mark.parametrize("data, reason", [
    (None, "no 'data' field"),
    (b"\xff\xfe", "not JSON"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"seq": 1}', "no ID field 'meta.id'"),
    (b'{"meta": {"id": ""}, "seq": 1}', "ID field 'meta.id' is empty"),
    (b'{"meta": {"id": "a"}}', "no key field 'seq'"),
    (b'{"meta": {"id": "a"}, "seq": "x"}', "is not an int"),
    (b'{"meta": {"id": "a"}, "seq": true}', "is not an int"),
    (b'{"meta": {"id": "a"}, "seq": 1, "pad": "' + b"x" * 300 + b'"}', "over the limit"),
])
def test_bad_entries_name_the_reason(data, reason):
    with pytest.raises(BadInput) as err:
        decode("1-0", data, SPEC)
    assert reason in err.value.reason


@pytest.mark.parametrize("key_type, raw, expected", [
    ("int", 7, 7), ("int", "7", 7), ("int", 7.0, 7), ("float", "2.5", 2.5), ("str", "5", "5"),
])
def test_keys_convert_without_loss(key_type, raw, expected):
    assert MessageSpec(key_type=key_type).parse_key(raw) == expected


@pytest.mark.parametrize("key_type, raw", [
    ("int", 7.5), ("int", "7.5"), ("int", "seven"), ("float", 10 ** 400), ("float", "nan"), ("float", "inf"),
    ("str", 5),
])
def test_keys_that_would_lose_or_not_order_are_bad(key_type, raw):
    with pytest.raises(BadInput):
        MessageSpec(key_type=key_type).parse_key(raw)


def test_positions_order_numerically_not_as_text():
    assert position_order("9-0") < position_order("10-0") < position_order("10-2")


# -- a bad message is a BadInput, never a crash -----------------------------------

BIG = MessageSpec(id_path="id", key_path="seq", key_type="int", max_bytes=4 << 20)


def refused(data, spec=BIG):
    with pytest.raises(BadInput) as err:
        decode("1-0", data, spec)
    return err.value.reason


def test_new_bounds_default_to_64_levels_and_100_digits():
    spec = MessageSpec()
    assert (spec.max_depth, spec.max_number_digits) == (64, 100)


@pytest.mark.parametrize("name", ["max_depth", "max_number_digits"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5])
def test_bounds_must_be_positive_integers(name, value):
    with pytest.raises(ValueError):
        MessageSpec(**{name: value})


def test_a_5000_digit_number_is_refused_not_a_crash():
    # Python refuses to convert it (ValueError) - this used to escape and kill the node.
    data = b'{"id": "big", "seq": ' + b"7" * 5000 + b"}"
    assert "a number longer than 100 digits" in refused(data)


def test_a_5000_digit_number_in_utf16_is_refused_too():
    data = '{"id": "big", "seq": 1, "n": 1'.encode("utf-16-le") + ("7" * 5000 + "}").encode("utf-16-le")
    assert "a number longer than 100 digits" in refused(data)


@pytest.mark.parametrize("literal", [
    "1" * 100, "-" + "9" * 100, "1" * 50 + "." + "2" * 50, "1" * 40 + "." + "2" * 40 + "e+" + "3" * 20,
])
def test_a_number_of_exactly_max_digits_is_accepted(literal):
    m = decode("1-0", b'{"id": "a", "seq": 1, "n": ' + literal.encode() + b"}", BIG)
    assert (m.id, m.key) == ("a", 1)
    assert json.loads(m.body)["n"] == json.loads(literal)


@pytest.mark.parametrize("literal", [
    "1" * 101, "-" + "9" * 101, "1" * 50 + "." + "2" * 51, "1" * 40 + "." + "2" * 40 + "e+" + "3" * 21,
])
def test_a_number_one_digit_longer_is_refused(literal):
    assert "a number longer than 100 digits" in refused(b'{"id": "a", "seq": 1, "n": ' + literal.encode() + b"}")


def test_the_digit_bound_follows_the_spec():
    spec = MessageSpec(id_path="id", key_path="seq", max_number_digits=3)
    assert decode("1-0", b'{"id": "a", "seq": 999, "n": [1, 22, 333]}', spec).key == 999
    assert "a number longer than 3 digits" in refused(b'{"id": "a", "seq": 1, "n": [1, 22, 4444]}', spec)


def nested(levels: int) -> bytes:
    """An object (level 1) holding ``levels - 1`` nested arrays."""
    inner = levels - 1
    return b'{"id": "a", "seq": 1, "x": ' + b"[" * inner + b"]" * inner + b"}"


def test_nesting_at_the_limit_is_accepted():
    m = decode("1-0", nested(64), BIG)
    depth, value = 1, json.loads(m.body)["x"]
    while value:
        depth, value = depth + 1, value[0]
    assert depth + 1 == 64  # the innermost [] is level 64


def test_nesting_one_level_deeper_is_refused():
    assert "nesting deeper than 64 levels" in refused(nested(65))


def test_objects_count_as_levels_like_arrays():
    spec = MessageSpec(id_path="id", key_path="seq", max_depth=3)
    assert decode("1-0", b'{"id": "a", "seq": 1, "x": {"y": {}}}', spec).id == "a"
    assert "nesting deeper than 3 levels" in refused(b'{"id": "a", "seq": 1, "x": {"y": {"z": {}}}}', spec)
    assert "nesting deeper than 3 levels" in refused(b'{"id": "a", "seq": 1, "x": [{"y": []}]}', spec)


@pytest.mark.parametrize("data", [
    b"[" * 100_000 + b"]" * 100_000,
    b"[" * 100_000,
    b'{"id": "deep", "seq": 1, "x": ' + b"[" * 500 + b"]" * 500 + b"}",
    b'{"a":' * 100_000,
], ids=["balanced", "unclosed", "500-in-object", "objects"])
def test_very_deep_nesting_is_refused_without_recursion_error(data):
    # json.loads raises RecursionError on these - this used to escape and kill the node.
    assert "nesting deeper than 64 levels" in refused(data)


def test_many_shallow_arrays_are_accepted():
    doc = {"id": "a", "seq": 1, "rows": [[i, [i]] for i in range(1000)]}
    assert decode("1-0", json.dumps(doc).encode(), BIG).id == "a"


@pytest.mark.parametrize("text", [
    "[" * 1000 + "{" * 1000,
    "7" * 5000,
    '\\"' + "[" * 200 + "1" * 200,        # an escaped quote does not end the string
    "\\\\" + "[[[" * 100,                 # an escaped backslash is no escape of the next character
    "é€😀" + "[" * 100 + "9" * 300,     # multi-byte UTF-8 around them
])
def test_brackets_and_digit_runs_inside_strings_are_accepted(text):
    doc = {"id": "a", "seq": 1, "s": text, "t": [text, {"u": text}]}
    for ensure_ascii in (True, False):
        m = decode("1-0", json.dumps(doc, ensure_ascii=ensure_ascii).encode(), BIG)
        assert json.loads(m.body)["s"] == text


def test_a_string_ending_in_an_escaped_backslash_does_not_hide_what_follows():
    data = b'{"id": "a\\\\", "seq": 1, "x": ' + b"[" * 100 + b"]" * 100 + b"}"
    assert "nesting deeper than 64 levels" in refused(data)
    data = b'{"id": "a\\\\", "seq": 1, "x": ' + b"1" * 101 + b"}"
    assert "a number longer than 100 digits" in refused(data)


@pytest.mark.parametrize("data", [b"\xff\xfe", b'{"id": "\xc3", "seq": 1}', b'{"id": "a", "seq": 1, "s": "\xed\xa0"}',
                                  b"\x80" * 1000])
def test_invalid_utf8_is_refused_as_not_json(data):
    assert "not JSON" in refused(data)


@pytest.mark.parametrize("data, kind", [
    ('{"id": "a", "seq": 1}', "str"), (17, "int"), ([b"{}"], "list"), ({"id": "a"}, "dict"), (1.5, "float"),
])
def test_data_that_is_not_bytes_like_is_refused(data, kind):
    assert f"body is a {kind}, not bytes" in refused(data)


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_bytes_like_data_is_accepted_and_kept_as_bytes(wrap):
    m = decode("1-0", wrap(b'{"id": "a", "seq": 3}'), BIG)
    assert (m.id, m.key, m.body) == ("a", 3, b'{"id": "a", "seq": 3}') and type(m.body) is bytes


def test_bytes_like_data_over_the_limit_is_refused_before_copying():
    assert "over the limit of 200" in refused(bytearray(b" " * 201), SPEC)


def test_an_unexpected_error_becomes_a_bad_message_naming_its_type(monkeypatch):
    def boom(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(message_module, "loads_known", boom)
    reason = refused(b'{"id": "a", "seq": 1}')
    assert "RecursionError" in reason and "maximum recursion depth" in reason


def test_a_broken_spec_still_gives_a_bad_message_naming_the_error():
    reason = refused(b'{"id": "a", "seq": 1}', MessageSpec(id_path="id", key_path="seq", key_type="bogus"))
    assert "key_type must be one of" in reason


def test_a_huge_string_key_is_refused_with_a_short_reason():
    reason = refused(b'{"id": "a", "seq": "' + b"7" * 5000 + b'"}')
    assert "longer than 100 digits" in reason and len(reason) < 300


def test_bounds_are_checked_in_linear_time():
    # Runs of just-allowed numbers, and many unterminated-looking strings: no quadratic blow-up.
    runs = b'{"id": "a", "seq": 1, "n": [' + b",".join([b"1" * 100] * 20_000) + b"]}"
    quotes = b'{"id": "a", "seq": 1, "s": "' + b'\\"' * 500_000 + b'"}'
    start = time.perf_counter()
    assert decode("1-0", runs, BIG).id == "a"
    assert decode("1-0", quotes, BIG).id == "a"
    assert time.perf_counter() - start < 2.0


# -- IDs: an ID is its text -----------------------------------------------------------

def test_an_integer_id_and_its_decimal_text_are_one_id():
    as_int = decode("1-0", b'{"id": 1, "seq": 7}', BIG)
    as_text = decode("1-1", b'{"id": "1", "seq": 7}', BIG)
    assert as_int.id == as_text.id == "1"
    assert decode("1-2", b'{"id": "01", "seq": 7}', BIG).id != as_int.id
    assert decode("1-3", b'{"id": -5, "seq": 7}', BIG).id == "-5"


def test_integer_ids_are_accepted_only_within_the_number_bound():
    m = decode("1-0", b'{"id": ' + b"9" * 100 + b', "seq": 7}', BIG)
    assert m.id == "9" * 100
    assert "a number longer than 100 digits" in refused(b'{"id": ' + b"9" * 101 + b', "seq": 7}')


@pytest.mark.parametrize("raw_id", [b"true", b"false", b"1.0", b"1.5", b"null", b"[1]", b'{"a": 1}'])
def test_ids_that_are_neither_text_nor_integers_are_refused(raw_id):
    assert refused(b'{"id": ' + raw_id + b', "seq": 7}') == "ID field 'id' is not a non-empty string or integer"


def test_an_empty_id_is_refused_as_empty():
    # "" is a string: the reason must not say it is not one.
    assert refused(b'{"id": "", "seq": 7}') == "ID field 'id' is empty"


# -- properties -----------------------------------------------------------------------

SMALL = MessageSpec(id_path="id", key_path="key", key_type="int", max_bytes=4096, max_depth=3, max_number_digits=6)


def total(data, spec):
    try:
        return decode("1-0", data, spec)
    except BadInput as exc:
        assert isinstance(exc.reason, str) and exc.reason
        return exc


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_decode_on_any_bytes_returns_a_message_or_raises_bad_message(data):
    for spec in (BIG, SMALL):
        result = total(data, spec)
        assert isinstance(result, (Message, BadInput))


JSONISH = st.lists(st.sampled_from([
    b"[", b"]", b"{", b"}", b'"', b"\\", b"\\\\", b'\\"', b":", b",", b" ", b"-", b".", b"e", b"+", b"0",
    b"1234567", b'"id"', b'"key"', b"true", b"null", b"\xc3\xa9", b"\xff", b"\x00",
]), max_size=80).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(JSONISH)
def test_decode_on_json_like_bytes_returns_a_message_or_raises_bad_message(data):
    for spec in (BIG, SMALL):
        assert isinstance(total(data, spec), (Message, BadInput))
        assert isinstance(total(b'{"id": "a", "key": 1, "x": ' + data + b"}", spec), (Message, BadInput))


def depth(value) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max(map(depth, children), default=0)


def longest_number(value) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return max(map(longest_number, value), default=0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return sum(c.isdigit() for c in json.dumps(value))
    return 0


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('[]{}"\\0123456789eé😀 '), max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans())
def test_bounds_measure_exactly_what_the_parser_meets(value, ensure_ascii):
    doc = {"id": "a", "key": 1, "v": value}
    data = json.dumps(doc, ensure_ascii=ensure_ascii).encode()
    result = total(data, SMALL)
    if depth(doc) > SMALL.max_depth:
        assert isinstance(result, BadInput) and "nesting deeper than 3 levels" in result.reason
    elif longest_number(doc) > SMALL.max_number_digits:
        assert isinstance(result, BadInput) and "a number longer than 6 digits" in result.reason
    else:
        assert isinstance(result, Message) and json.loads(result.body) == doc


def test_a_string_int_key_is_bounded_like_a_number():
    assert decode("1-0", b'{"id": "a", "seq": "' + b"9" * 100 + b'"}', BIG).key == int("9" * 100)
    assert decode("1-0", b'{"id": "a", "seq": "-' + b"9" * 100 + b'"}', BIG).key == -int("9" * 100)
    assert "longer than 100 digits" in refused(b'{"id": "a", "seq": "' + b"9" * 101 + b'"}')


# -- text that cannot be written ---------------------------------
# A lone surrogate is valid JSON (an escape) but no UTF-8 encoder takes it: a Redis key or
# an output built from it fails. Such a message is refused here, whatever field holds it.

LONE = ["\\ud800", "\\udfff", "x\\ud83d", "\\ude00y", "\\uDBFF", "\\ud83d\\ud83d"]


@pytest.mark.parametrize("escape", LONE)
@pytest.mark.parametrize("field", ["id", "uuid", "order_id", "type", "grp", "deep", "key_name"])
def test_a_lone_surrogate_anywhere_is_refused_with_the_reason(escape, field):
    body = {"id": "m1", "seq": 1, "uuid": "u", "order_id": "o", "type": "order", "grp": "g", "deep": {"a": ["x"]}}
    text = json.dumps(body)
    if field == "deep":
        text = text.replace('["x"]', f'["{escape}"]')
    elif field == "key_name":
        text = text.replace('"grp"', f'"{escape}"')
    else:
        text = text.replace(f'"{field}": "{body[field]}"', f'"{field}": "{escape}"')
    assert escape in text
    assert "not valid Unicode (a lone surrogate" in refused(text.encode())


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32"])
def test_surrogates_encoded_in_the_bytes_are_refused_as_not_json(encoding):
    data = '{"id": "\ud800", "seq": 1}'.encode(encoding, "surrogatepass")
    assert "not JSON" in refused(data)


@pytest.mark.parametrize("text, value", [
    ('"\\ud83d\\ude00"', "\U0001F600"),          # a pair is one character
    ('"\\\\ud800"', "\\ud800"),                  # an escaped backslash, then plain letters
    ('"\\u0000\\u202e\\uffff"', "\x00\u202e\uffff"),  # NUL, a right-to-left mark, a non-character
])
def test_surrogate_pairs_and_look_alikes_are_accepted(text, value):
    m = decode("1-0", f'{{"id": "a", "seq": 1, "v": {text}}}'.encode(), BIG)
    assert m.doc["v"] == value


UNICODE_VALUES = st.recursive(
    st.text(max_size=6) | st.integers() | st.none(),  # hypothesis's text includes lone surrogates
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(UNICODE_VALUES, st.booleans())
def test_whatever_decode_accepts_can_be_written_to_redis(value, ensure_ascii):
    """Every text of an accepted message encodes as UTF-8: its ID, and its document as
    the master writes it out (what a key, a state entry or an output is made of)."""
    try:
        data = json.dumps({"id": "a", "seq": 1, "v": value}, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    except UnicodeEncodeError:
        return
    result = total(data, BIG)
    has_lone = any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(value, ensure_ascii=False))
    assert isinstance(result, BadInput) == has_lone
    if isinstance(result, Message):
        result.id.encode("utf-8")
        json.dumps(result.doc, ensure_ascii=False).encode("utf-8")


def as_read(data: bytes):
    """What the standard library reads from ``data``: its document as exact text (an int and
    an equal float differ), or the reason it refuses it."""
    try:
        return json.dumps(json.loads(data))
    except ValueError as exc:
        return f"body is not JSON: {exc}"


NUMBERS = st.one_of(
    st.integers(), st.integers(-2 ** 70, 2 ** 70),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.from_regex(r"-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?", fullmatch=True),
).map(str)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(NUMBERS, st.sampled_from(['"\\ud800"', '"\\ud83d\\ude00"', '"é"', "NaN", "-Infinity",
                                                      '{"a": 1, "a": 2}', "[]", "true", "1e999"])), max_size=4))
def test_a_body_reads_exactly_as_the_standard_library_reads_it(values):
    # The parser is orjson with the standard library behind it (json_text.loads): whatever the
    # body, the document (to its numbers' types) or the refusal is the standard library's.
    data = ('{"id": "a", "seq": 1, "v": [' + ", ".join(values) + "]}").encode()
    result = total(data, BIG)
    expected = as_read(data)
    if isinstance(result, BadInput):
        assert result.reason == expected or "surrogate" in result.reason
    else:
        assert json.dumps(result.doc) == expected


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_json_like_bytes_read_as_the_standard_library_reads_them(data):
    body = b'{"id": "a", "seq": 1, "x": ' + data + b"}"
    result = total(body, BIG)
    if isinstance(result, Message):
        assert json.dumps(result.doc) == as_read(body)
