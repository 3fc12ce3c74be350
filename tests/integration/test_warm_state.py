"""A worker's warm copy of the history against a real redis-server: it follows the change log
that every COMMIT writes, hands a new master the same state a whole read gives, and is dropped
(the promotion then reads the state whole) whenever the log cannot bring it to Redis's state."""

from pathlib import Path

import pytest
import redis

from twinflow.cluster.master_flow import MasterFlow
from twinflow.cluster.warm_state import WarmState
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.step import Step
from twinflow.testing.messages import order_or_payment

CHAINED = parse_graph((Path(__file__).parents[2] / "examples" / "cluster-chained.yaml").read_text(), "chained")


class Master:
    """A master committing steps of the chained flow's messages, ``seq`` numbering them."""

    def __init__(self, store: FlowStore, epoch: int = 1):
        self.store, self.epoch = store, epoch
        self.flow = MasterFlow.load(CHAINED, store)
        self.seq = 0
        self.now = 1000.0

    def step(self, n: int) -> Step:
        msgs = []
        for _ in range(n):
            doc = order_or_payment(self.seq)
            self.seq += 1
            msgs.append(Message(doc["id"], None, f"{self.seq}-0", b"{}", doc))
        self.now += 1.0
        step = self.flow.run(msgs, now=self.now, epoch=self.epoch)
        self.store.commit(self.epoch, step)
        self.flow.committed(step)
        return step


def state_of(flow: MasterFlow) -> dict:
    """What a flow holds that a promotion must get right: the history's verdict per
    identifier, the open join groups, the mark and the version."""
    guard, match = flow.graph.nodes["guard"], flow.graph.nodes["match"]
    history = {f"order-{k}": guard.store.get(("guard", f"order-{k}")) for k in range(200)}
    history.update({f"payment-{k}": guard.store.get(("guard", f"payment-{k}")) for k in range(200)})
    return {"history": history, "history_size": len(guard.store), "open_groups": match.pending(),
            "mark": flow.mark, "version": flow.version}


@pytest.fixture
def stores(redis_url, flow_name):
    def store(peer):
        return FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), peer, id_ttl=600)
    return store("a"), store("b")


def test_the_copy_follows_the_log_and_a_promotion_gets_what_a_whole_read_gets(stores):
    a, b = stores
    master = Master(a)
    master.step(30)
    warm = WarmState(CHAINED, b)
    warm.follow()                      # primed: a whole read, once
    assert warm.ready and warm.primes == 1
    for n in (7, 12, 1):
        master.step(n)
    warm.follow()                      # three steps applied from the log
    assert warm.applied == 3
    master.step(9)                     # committed after the last round: the promotion's tail
    master.step(4)
    flow = warm.take()
    assert flow is not None and warm.applied == 5 and warm.primes == 1
    assert not warm.ready              # the copy is the new master's now
    whole = MasterFlow.load(CHAINED, b)
    assert state_of(flow) == state_of(whole)
    assert state_of(flow)["history_size"] > 0 and state_of(flow)["open_groups"] > 0
    # The flow taken is a master's flow: it builds the next step on the version Redis holds.
    master.flow = flow
    master.step(5)
    assert state_of(MasterFlow.load(CHAINED, b))["version"] == flow.version


def test_a_log_trimmed_past_the_copy_is_a_gap_and_the_copy_is_primed_again(stores):
    a, b = stores
    master = Master(a)
    warm = WarmState(CHAINED, b, count=2)
    master.step(10)
    warm.follow()
    for _ in range(5):
        master.step(3)
    a.r.xtrim(a.keys.changes, maxlen=1, approximate=False)  # what MAXLEN ~ does to a worker far behind
    warm.follow()
    assert not warm.ready and warm.dropped == 1
    assert warm.take() is None         # no copy: the promotion reads the state whole
    warm.follow()                      # primed again
    assert warm.ready and warm.primes == 2
    master.step(6)
    flow = warm.take()
    assert flow is not None and state_of(flow) == state_of(MasterFlow.load(CHAINED, b))


def following(stores, *steps: int) -> tuple[Master, WarmState]:
    """A master on the first store and a worker's copy on the second that followed each step."""
    a, b = stores
    master, warm = Master(a), WarmState(CHAINED, b)
    for n in steps:
        master.step(n)
        warm.follow()
    return master, warm


def test_a_lost_anchor_or_a_step_without_its_log_entry_drops_the_copy(stores):
    a, _ = stores
    master, warm = following(stores, 10, 4)
    # The entry the copy applied last is gone (a Redis failover lost it, and more was written).
    last = a.r.xrevrange(a.keys.changes, count=1)[0][0]
    a.r.xdel(a.keys.changes, last)
    master.step(4)
    assert warm.take() is None and warm.dropped == 1

    warm.follow()
    assert warm.ready
    # A step written by a master that logs nothing (older code): the versions have a gap.
    master.flow.logged = ()
    master.step(4)
    master.flow.logged = ("guard",)
    master.step(4)
    assert warm.take() is None and warm.dropped == 2


def test_a_copy_that_redis_is_behind_is_not_handed_over(stores):
    # Redis lost steps the copy applied (a failover without WAIT) and took new ones since: the
    # version in Redis is at or below the copy's, or the log does not reach it.
    a, _ = stores
    master, warm = following(stores, 10, 5)
    a.r.decr(a.keys.version)           # the state version went back by one
    assert warm.take() is None and warm.dropped == 1


def test_a_copy_that_keeps_falling_behind_is_primed_again_less_and_less_often(stores):
    # Each prime reads the history whole: after drops in a row the worker waits longer.
    a, b = stores
    now = [0.0]
    master = Master(a)
    warm = WarmState(CHAINED, b, monotonic=lambda: now[0])
    master.step(5)

    def fall_behind():
        warm.follow()
        assert warm.ready
        master.step(2)
        master.step(2)
        a.r.xtrim(a.keys.changes, maxlen=1, approximate=False)
        warm.follow()
        assert not warm.ready

    fall_behind()                      # first drop: primed again at once
    fall_behind()                      # second in a row: not before a second has passed
    warm.follow()
    assert not warm.ready and warm.primes == 2
    now[0] += 1.0
    fall_behind()                      # third: four seconds
    now[0] += 3.9
    warm.follow()
    assert not warm.ready
    now[0] += 0.1
    warm.follow()
    assert warm.ready and warm.primes == 4
