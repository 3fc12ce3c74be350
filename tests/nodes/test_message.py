"""Decoding uplink entries: good ones, and every kind of bad one with its reason."""

import pytest

from twinflow.runtime.message import BadMessage, MessageSpec, decode, position_order

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
    (b'{"meta": {"id": ""}, "seq": 1}', "not a non-empty string"),
    (b'{"meta": {"id": "a"}}', "no key field 'seq'"),
    (b'{"meta": {"id": "a"}, "seq": "x"}', "is not a int"),
    (b'{"meta": {"id": "a"}, "seq": true}', "is not a int"),
    (b'{"meta": {"id": "a"}, "seq": 1, "pad": "' + b"x" * 300 + b'"}', "over the limit"),
])
def test_bad_entries_name_the_reason(data, reason):
    with pytest.raises(BadMessage) as err:
        decode("1-0", data, SPEC)
    assert reason in err.value.reason


@pytest.mark.parametrize("key_type, raw, expected", [
    ("int", 7, 7), ("int", "7", 7), ("int", 7.0, 7), ("float", "2.5", 2.5), ("str", 5, "5"),
])
def test_keys_convert_without_loss(key_type, raw, expected):
    assert MessageSpec(key_type=key_type).parse_key(raw) == expected


@pytest.mark.parametrize("key_type, raw", [
    ("int", 7.5), ("int", "7.5"), ("int", "seven"), ("float", 10 ** 400), ("float", "nan"), ("float", "inf"),
])
def test_keys_that_would_lose_or_not_order_are_bad(key_type, raw):
    with pytest.raises(BadMessage):
        MessageSpec(key_type=key_type).parse_key(raw)


def test_positions_order_numerically_not_as_text():
    assert position_order("9-0") < position_order("10-0") < position_order("10-2")
