"""One reader: the uplink reader (runtime/message.py) and the nodes read keys, field paths and
bad input the same way, so a value means the same on the cluster as in replay."""

import pytest

from twinflow.runtime.fields import BadInput, FieldPath, MissingField
from twinflow.runtime.message import MessageSpec, decode
from twinflow.runtime.nodes import sort
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.params import Doc, Params


def sort_node(key_type: str):
    doc = Doc(f"key_type: {key_type}\nrulesets:\n- {{name: all, key: '{{k}}'}}\n", "f.yaml")
    return sort.build("s", Params(doc, "", doc.value))


@pytest.mark.parametrize("key_type, raw", [
    ("int", 7.0), ("int", "7"), ("int", 7), ("float", 2.5), ("float", "2.5"), ("str", "x"),
    ("int", 7.5), ("int", True), ("float", float("inf")), ("float", "nan"), ("str", 7), ("int", "1" * 101),
])
def test_the_reader_and_the_sort_node_agree_on_every_key(key_type, raw):
    spec = MessageSpec(key_path="k", key_type=key_type)
    try:
        spec.parse_key(raw)
        reader_ok = True
    except BadInput:
        reader_ok = False
    [emit] = sort_node(key_type).on_message(Msg("m", {"k": raw}), 0.0)
    assert (emit.outlink != "failure") == reader_ok, (raw, emit.info)


def test_a_list_index_in_a_field_path_works_for_the_reader_and_the_nodes():
    body = b'{"meta": [{"id": "m1"}], "k": [3]}'
    m = decode("1-0", body, MessageSpec(id_path="meta.0.id", key_path="k.0"))
    assert (m.id, m.key) == ("m1", 3)
    assert FieldPath("meta.0.id").get(m.doc) == "m1"


def test_missing_fields_are_bad_input_everywhere():
    with pytest.raises(BadInput, match="no field 'a.b'"):
        FieldPath("a.b").get({"a": {}})
    assert issubclass(MissingField, BadInput)
    with pytest.raises(BadInput, match="no ID field"):
        decode("1-0", b'{"x": 1}', MessageSpec())
