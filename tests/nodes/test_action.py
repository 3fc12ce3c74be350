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
    with pytest.raises(FlowFileError, match="n.on_retry_failure: must be one of error, suspend"):
        build("a", params("on_retry_failure: pause\n"))
    for bad in ("0", "-5", "soon", "[1]"):
        with pytest.raises(FlowFileError, match="n.suspend_for: must be"):
            build("a", params(f"on_retry_failure: suspend\nsuspend_for: {bad}\n"))


def test_the_handler_is_told_the_attempt_when_it_asks():
    attempts = []

    def deliver(msg, attempt):
        attempts.append((msg.id, attempt))
        if attempt < 3:
            raise TransientError("busy")

    node = ActionNode("a", handler=deliver, retry_interval=1.0, max_retries=5)
    node.on_message(Msg("m", {}), 0.0)
    node.on_time(1.0)
    assert outs(node.on_time(2.0)) == [("done", "m", {})]
    assert attempts == [("m", 1), ("m", 2), ("m", 3)]


# -- suspend and retry later -----------------------------------------------------------------
def suspending(svc, **kw):
    return ActionNode("a", handler=svc, retry_interval=1.0, max_retries=1, on_retry_failure="suspend",
                      suspend_for=30.0, **kw)


def test_retries_used_up_suspend_the_node_and_later_messages_wait_behind_in_order():
    svc = Service(2)  # fails twice: the first attempt and its one retry
    node = suspending(svc)
    node.on_message(Msg("m1", {}), 0.0)
    assert node.on_time(1.0) == []  # the retry fails too: suspended, not an error
    assert node.suspension() == {"node": "a", "id": "m1", "since": 1.0, "until": 31.0, "behind": 0,
                                 "reason": "service error after 1 retries: TransientError: busy"}
    assert node.on_message(Msg("m2", {}), 5.0) == [] and node.on_message(Msg("m3", {}), 6.0) == []
    assert svc.calls == ["m1", "m1"] and node.pending() == 3 and node.next_deadline() == 31.0
    assert node.pending_counts() == {"held": 3, "retries": 1, "behind": 2}  # a peer's status: pending_nodes
    assert [o[:2] for o in outs(node.on_time(31.0))] == [("done", "m1"), ("done", "m2"), ("done", "m3")]
    assert node.suspension() is None and node.pending() == 0


def test_resume_ends_the_suspension_at_once_starting_with_the_suspended_message():
    node = suspending(Service(2))
    node.on_message(Msg("m1", {}), 0.0)
    node.on_time(1.0)
    node.on_message(Msg("m2", {}), 2.0)
    assert node.resume(3.0) is True and node.next_deadline() == 3.0
    assert [o[:2] for o in outs(node.on_time(3.0))] == [("done", "m1"), ("done", "m2")]
    assert node.resume(4.0) is False


def test_a_message_that_fails_again_after_the_suspension_suspends_the_node_again():
    node = suspending(Service(4))
    node.on_message(Msg("m1", {}), 0.0)
    node.on_time(1.0)
    node.on_message(Msg("m2", {}), 2.0)
    assert node.on_time(31.0) == [] and node.on_time(32.0) == []  # retries anew, used up again
    assert node.suspension()["since"] == 32.0 and node.suspension()["behind"] == 1
    assert [o[:2] for o in outs(node.on_time(62.0))] == [("done", "m1"), ("done", "m2")]


def test_a_retry_due_during_a_suspension_waits_behind_it():
    calls = []

    def handler(msg):
        calls.append(msg.id)
        if msg.id == "bad" and calls.count("bad") <= 2 or msg.id == "slow" and calls.count("slow") == 1:
            raise TransientError("busy")

    node = ActionNode("a", handler=handler, retry_interval=10.0, max_retries=1, on_retry_failure="suspend",
                      suspend_for=30.0)
    node.on_message(Msg("bad", {}), 0.0)
    node.on_message(Msg("slow", {}), 5.0)  # its retry is due at 15, after the suspension began at 10
    assert node.on_time(15.0) == [] and calls == ["bad", "slow", "bad"]
    assert [o[:2] for o in outs(node.on_time(40.0))] == [("done", "bad"), ("done", "slow")]


def test_a_suspension_survives_a_reload_of_the_state():
    first = suspending(Service(2))
    first.on_message(Msg("m1", {}), 0.0)
    first.on_time(1.0)
    first.on_message(Msg("m2", {}), 2.0)
    entries = first.changed_state()
    again = suspending(Service(0))
    again.load_state({k: v for k, v in entries.items() if v is not None})
    assert again.suspension() == first.suspension()
    again.on_message(Msg("m3", {}), 3.0)
    assert [o[:2] for o in outs(again.on_time(31.0))] == [("done", "m1"), ("done", "m2"), ("done", "m3")]
