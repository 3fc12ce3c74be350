"""ActionNode: success, transient retries at the retry interval, service errors (fake time)."""

import pytest

from twinflow.runtime.nodes.action import ActionNode, TransientError, build
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.params import Doc, FlowFileError, Params


class Service:
    def __init__(self, failures, exc=TransientError):
        self.failures, self.exc, self.calls = failures, exc, []

    def __call__(self, msg):
        self.calls.append(msg.id)
        if len(self.calls) <= self.failures:
            raise self.exc("busy")


def outs(emits):
    return [(e.outlink, e.msgs[0].id, dict(e.info)) for e in emits]


def test_success_goes_to_done():
    node = ActionNode("a", handler=Service(0))
    assert outs(node.on_message(Msg("m", {}), 0.0)) == [("done", "m", {})]


def test_transient_error_retried_after_the_interval_then_done():
    svc = Service(2)
    node = ActionNode("a", handler=svc, retry_interval=5.0, max_retries=3)
    assert node.on_message(Msg("m", {}), 10.0) == []
    assert node.pending() == 1 and node.next_deadline() == 15.0
    assert node.on_time(14.9) == []
    assert node.on_time(15.0) == [] and node.next_deadline() == 20.0
    assert outs(node.on_time(20.0)) == [("done", "m", {})]
    assert svc.calls == ["m", "m", "m"] and node.pending() == 0


def test_retries_used_up_become_a_service_error():
    node = ActionNode("a", handler=Service(10), retry_interval=1.0, max_retries=2)
    node.on_message(Msg("m", {}), 0.0)
    node.on_time(1.0)
    (out,) = outs(node.on_time(2.0))
    assert out[:2] == ("error", "m") and "after 2 retries" in out[2]["reason"]


def test_other_exception_is_a_service_error_at_once():
    node = ActionNode("a", handler=Service(1, exc=KeyError), max_retries=5)
    (out,) = outs(node.on_message(Msg("m", {}), 0.0))
    assert out[:2] == ("error", "m") and "KeyError" in out[2]["reason"] and node.pending() == 0


def test_retries_fire_in_deadline_order():
    node = ActionNode("a", handler=Service(2), retry_interval=3.0)
    node.on_message(Msg("x", {}), 0.0)
    node.on_message(Msg("y", {}), 1.0)
    assert [o[1] for o in outs(node.on_time(10.0))] == ["x", "y"]


def params(text):
    doc = Doc(text, "f.yaml")
    return Params(doc, "n", doc.value)


def test_build_refuses_bad_parameters():
    with pytest.raises(FlowFileError, match="f.yaml:1: n.handler: cannot import 'nosuch.mod:f'"):
        build("a", params("handler: 'nosuch.mod:f'\n"))
    with pytest.raises(FlowFileError, match="n.transient: must name an exception class"):
        build("a", params("transient: 'os.path:join'\n"))
    with pytest.raises(FlowFileError, match="n.retry_interval: must be seconds"):
        build("a", params("retry_interval: -1\n"))
    with pytest.raises(FlowFileError, match="n.colour: unknown field"):
        build("a", params("colour: red\n"))
