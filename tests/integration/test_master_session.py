"""The master's session against a real redis-server: a step is sent while the one before is
in Redis (two at most), steps commit in order, a refused write ends the session with nothing
after it written, and what it did comes back as an Outcome."""

import threading
from concurrent.futures import Executor, ThreadPoolExecutor

import pytest
import redis

from twinflow.cluster.master_flow import MasterFlow
from twinflow.cluster.master_session import MasterSession
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import DELIVER_MAX_MESSAGES, FlowStore
from twinflow.runtime.store.store_errors import Fenced
# A claim pair, so that what a session commits comes back as claims to escalate.
DELIVER = parse_graph("flow: f\nuplink: {stream: uplink}\ninput: deliver\nnodes:\n"
                      "  deliver: {type: action, sink: {stream: sink}}\n"
                      "  claims: {type: sort, pairs_with: deliver, key: x, key_type: int, bake_time: 5.0, "
                      "unclaimed_outlink: done}\n")


class GatedWrites(Executor):
    """Writer threads whose n-th write (of the first ``steps``) starts only once the loop has
    built the step after it (``until="built"``) or sent it (``until="sent"``), or it is the last,
    so a loop that waited for each write before building (or sending) the next would hang here.
    The log says when each step was sent, and how each write ended."""

    def __init__(self, steps: int, before_write=None, after_write=None, until: str = "built"):
        self.pool = ThreadPoolExecutor(max_workers=3)
        self.steps, self.until = steps, until
        self.built = [threading.Event() for _ in range(steps + 2)]
        self.sent = [threading.Event() for _ in range(steps + 2)]
        self.before_write = before_write or (lambda n: None)
        self.after_write = after_write or (lambda n: None)
        self.log: list[str] = []
        self.n = 0

    def submit(self, fn, /, *args, **kwargs):
        self.n += 1
        n = self.n
        self.log.append(f"send {n}")
        if n < len(self.sent):
            self.sent[n].set()
        gate = (self.sent if self.until == "sent" else self.built)[n + 1] if n < self.steps else None

        def gated():
            if gate is not None and not gate.wait(10):
                raise AssertionError(f"step {n + 1} was not {self.until} while step {n} was in Redis")
            self.before_write(n)
            try:
                out = fn(*args, **kwargs)
            except BaseException as exc:
                self.log.append(f"failed {n}: {type(exc).__name__}")
                raise
            self.log.append(f"done {n}")
            self.after_write(n)
            return out
        return self.pool.submit(gated)


class Session(MasterSession):
    """A session on a real store whose writes are gated, counting the steps it builds."""

    def __init__(self, store: FlowStore, writes: GatedWrites, graph=DELIVER, epoch=1):
        super().__init__(graph.fresh(), store, epoch, writes)
        self.builds = 0

    def load(self):
        self.builds += 1
        if self.builds < len(self.writes.built):
            self.writes.built[self.builds].set()  # the session builds step `builds` now
        return super().load()


def claimed(out) -> list[str]:
    return [mid for mid, _, _, _ in out.claims]


@pytest.fixture
def store(redis_url, flow_name):
    return FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "n1")


def batch(n: int) -> list[Message]:
    return [Message(id=f"m{i}", key=i, position=f"{i + 1}-0", body=b'{"x":1}', doc={"id": f"m{i}", "x": 1},
                    rule="all", cid=f"m{i}")
            for i in range(n)]


def test_each_step_is_sent_while_the_one_before_is_in_redis_two_at_most(store):
    msgs = batch(2 * DELIVER_MAX_MESSAGES + 5)  # three steps
    session = Session(store, GatedWrites(3, until="sent"))
    out = session.run_batch(msgs, msgs[-1].position, now=lambda: 0.0)
    assert out.rest is None and out.refused is None and out.steps == 3 and out.delivered == len(msgs)
    # Step 2 goes while step 1 is in Redis; step 3 only once step 1 is done; they commit in order.
    assert session.writes.log == ["send 1", "send 2", "done 1", "send 3", "done 2", "done 3"]
    assert claimed(out) == [m.id for m in msgs]  # to escalate in uplink order, each after its COMMIT
    assert store.processed_mark() == msgs[-1].position
    assert store.r.xlen(store.keys.sink) == len(msgs)


def test_steps_are_as_long_as_the_flow_file_says_and_only_the_last_moves_the_mark_past_the_batch(store):
    # cluster.step_messages: 3 cuts a batch of 8 into steps of 3, 3 and 2. A step that is not
    # the batch's last marks processed only up to its own last message: a master that dies
    # after it leaves the rest after the mark, for its successor to run.
    graph = parse_graph(DELIVER.text + "cluster: {step_messages: 3}\n")
    assert graph.cluster.step_messages == 3
    marks = []
    session = Session(store, GatedWrites(3, after_write=lambda n: marks.append(store.processed_mark())), graph)
    msgs = batch(8)
    out = session.run_batch(msgs, "20-0", now=lambda: 0.0)  # entries after the last message: bad ones
    assert out.rest is None and out.steps == 3 and out.delivered == 8
    assert marks == ["3-0", "6-0", "20-0"]
    assert store.processed_mark() == "20-0"
    assert claimed(out) == [m.id for m in msgs]


def test_a_refused_write_ends_the_batch_and_the_step_sent_behind_it_is_never_written(store):
    msgs = batch(2 * DELIVER_MAX_MESSAGES + 5)

    def newer_master_first(n):
        if n == 2:
            store.raise_epoch(2)

    session = Session(store, GatedWrites(3, before_write=newer_master_first, until="sent"))
    out = session.run_batch(msgs, msgs[-1].position, now=lambda: 0.0)
    first = msgs[:DELIVER_MAX_MESSAGES]
    assert out.rest == msgs[len(first):]
    assert isinstance(out.refused, Fenced) and out.steps == 1
    # Step 3 went to a writer behind step 2, which waited for step 2's answer and wrote nothing.
    assert session.writes.log == ["send 1", "send 2", "done 1", "send 3", "failed 2: Fenced", "failed 3: _NotSent"]
    assert claimed(out) == [m.id for m in first]
    assert store.processed_mark() == first[-1].position
    assert store.r.xlen(store.keys.sink) == len(first)
    assert session.flow is None and not session.active  # built ahead of Redis: dropped; the term is over
    assert session.run_batch(msgs[len(first):], msgs[-1].position, now=lambda: 0.0).steps == 0


JOIN = parse_graph("flow: f\nuplink: {stream: uplink}\nnodes:\n  match: {type: join, join_type: and, "
                   "types: [order, payment], type_field: type, activation_field: order_id, timeout: 10}\n")


class ReloadedMidBatch(Session):
    """The flow is dropped and loaded again from Redis just before step 2 is built, while
    step 1 is still in flight (as the timer or election thread may drop it): step 2 is then
    built on state without step 1."""

    def load(self):
        if self.builds == 1:  # building step 2
            self.flow = MasterFlow.load(self.graph.fresh(), self.store)
        return super().load()


def test_a_step_built_on_a_flow_reloaded_while_the_step_before_was_in_flight_is_built_again(store):
    def doc(i, kind, order):
        return Message(id=f"m{i}", key=i, position=f"{i + 1}-0", body=b"{}", rule="all", cid=f"m{i}",
                       doc={"id": f"m{i}", "type": kind, "order_id": order})
    # Step 1 ends with o1's order (its group opens); step 2 holds o1's payment.
    msgs = [doc(i, "order", f"x{i}") for i in range(DELIVER_MAX_MESSAGES - 1)]
    msgs += [doc(DELIVER_MAX_MESSAGES - 1, "order", "o1"), doc(DELIVER_MAX_MESSAGES, "payment", "o1")]
    session = ReloadedMidBatch(store, GatedWrites(2), graph=JOIN)
    out = session.run_batch(msgs, msgs[-1].position, now=lambda: 0.0)
    assert out.rest is None
    # Step 2 as first built (on state without o1's group) was refused; built again on
    # Redis's state, the payment joins the order.
    joined = [e[1][b"id"].decode() for e in store.r.xrange(store.keys.out("match", "joined"))]
    assert joined == [f"m{DELIVER_MAX_MESSAGES - 1}+m{DELIVER_MAX_MESSAGES}"]
    assert out.delivered == len(msgs) and out.claims == []  # no claim pair in this flow: nothing to escalate


def _failures(store) -> dict[str, str]:
    return {f[b"position"].decode(): f[b"reason"].decode() for _, f in store.r.xrange(store.keys.failure)}


@pytest.mark.parametrize("guess", [False, True])
def test_a_message_whose_values_cannot_be_written_leaves_by_the_failure_stream_and_the_batch_goes_on(store, guess):
    # A message no decoder would let through (its ID a lone surrogate, made here directly):
    # its step cannot be encoded for Redis. The backstop finds it, and only it fails.
    msgs = batch(6)
    msgs[2] = Message(id="\ud800", key=2, position=msgs[2].position, body=b'{"id": "\\ud800"}', doc={"id": "\ud800"},
                      rule="all", cid="\ud800")
    session = Session(store, GatedWrites(0))
    if guess:
        session.load()  # a flow held: the session guesses from its mark
    out = session.run_batch(msgs, msgs[-1].position, now=lambda: 0.0)
    assert out.rest is None and out.failed == 1
    assert [f[b"id"].decode() for _, f in store.r.xrange(store.keys.sink)] == ["m0", "m1", "m3", "m4", "m5"]
    failures = _failures(store)
    assert list(failures) == [msgs[2].position] and "cannot be written to Redis" in failures[msgs[2].position]
    assert store.processed_mark() == msgs[-1].position


def test_a_message_the_flow_raises_an_error_for_leaves_by_the_failure_stream_and_the_batch_goes_on(store, monkeypatch):
    from twinflow.runtime.nodes.action import ActionNode
    on_message = ActionNode.on_message

    def fragile(self, msg, now):  # a node defect that only one message triggers
        if msg.id == "m1001":
            raise KeyError("boom")
        return on_message(self, msg, now)
    monkeypatch.setattr(ActionNode, "on_message", fragile)
    msgs = batch(DELIVER_MAX_MESSAGES + 5)  # the bad one in the second step, while the first is in Redis
    session = Session(store, GatedWrites(2))
    out = session.run_batch(msgs, msgs[-1].position, now=lambda: 0.0)
    assert out.rest is None and out.failed == 1
    sink = [f[b"id"].decode() for _, f in store.r.xrange(store.keys.sink)]
    assert sink == [m.id for m in msgs if m.id != "m1001"]
    failures = _failures(store)
    assert list(failures) == [msgs[1001].position]
    assert "KeyError" in failures[msgs[1001].position] and "could not take this message" in failures[msgs[1001].position]
    assert claimed(out) == [m.id for m in msgs]  # the worker releases the bad one from its bake too
    assert store.processed_mark() == msgs[-1].position


def test_fire_returns_what_it_did_and_a_newer_term_fences_the_old_session(store):
    order = Message(id="o1", key=1, position="1-0", body=b"{}", doc={"id": "o1", "type": "order", "order_id": "x"})
    old = Session(store, GatedWrites(0), graph=JOIN)
    assert old.run_batch([order], order.position, now=lambda: 0.0).steps == 1
    assert old.next_deadline() == 10.0  # the join's time-out
    assert old.fire(5.0).steps == 1 and store.r.xlen(store.keys.out("match", "expired")) == 0

    fired = old.fire(10.0)
    assert fired.steps == 1 and fired.refused is None
    assert [e[1][b"id"].decode() for e in store.r.xrange(store.keys.out("match", "expired"))] == ["o1"]

    store.raise_epoch(2)  # a newer master's term
    late = Message(id="o2", key=2, position="2-0", body=b"{}", doc={"id": "o2", "type": "order", "order_id": "y"})
    out = old.run_batch([late], late.position, now=lambda: 11.0)
    assert isinstance(out.refused, Fenced) and out.rest == [late] and not old.active
    assert old.fire(30.0).steps == 0  # an ended session sends nothing
