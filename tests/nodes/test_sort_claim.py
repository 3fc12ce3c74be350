"""Claim-mode SortNode: bake, claim, surface unclaimed, rollback (fake clock, no servers)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.clock import FakeClock
from twinflow.runtime.message import Message
from twinflow.runtime.nodes.sort import ClaimSortNode


def msg(i: int, key: int | None = None) -> Message:
    return Message(id=f"m{i}", key=i if key is None else key, position=f"{1000 + i}-0", body=b"{}")


def ids(msgs):
    return [m.id for m in msgs]


def test_claim_releases_everything_at_or_below_the_key_up_to_its_position():
    node = ClaimSortNode(bake_time=5.0)
    for i in range(5):
        assert node.offer(msg(i), now=0.0) is None
    assert ids(node.claim("m2", 2, msg(2).position)) == ["m0", "m1", "m2"]
    assert node.baked == 2 and node.claimed == 3
    assert ids(node.rollback()) == ["m3", "m4"]


def test_already_processed_message_is_never_baked():
    node = ClaimSortNode(bake_time=5.0)
    assert node.offer(msg(1), now=0.0, processed=True) == "bypass"
    assert node.pending == 0 and node.claimed == 1


def test_lower_key_later_in_the_uplink_waits_for_its_own_claim():
    # m1 carries key 10, m2 (later in the uplink) key 5: a claim of m1 must not
    # take m2, which the master has not processed yet.
    node = ClaimSortNode(bake_time=5.0)
    node.offer(msg(1, key=10), now=0.0)
    node.offer(msg(2, key=5), now=0.0)
    assert ids(node.claim("m1", 10, msg(1).position)) == ["m1"]
    assert ids(node.rollback()) == ["m2"]


def test_fully_baked_message_is_surfaced_but_stays_recoverable():
    clock = FakeClock(100.0)
    node = ClaimSortNode(bake_time=5.0, unclaimed_outlink="failure")
    node.offer(msg(1), now=clock.now())
    clock.advance(1.0)
    node.offer(msg(2), now=clock.now())
    assert node.next_deadline() == 105.0
    assert node.tick(clock.advance(3.9)) == []
    assert ids(node.tick(clock.advance(0.1))) == ["m1"]
    assert node.unclaimed == 1 and node.next_deadline() == 106.0
    # routed out, yet a rollback still returns it, in uplink order
    assert ids(node.rollback()) == ["m1", "m2"]
    assert node.pending == 0 and node.rolled_back == 2


def test_claim_and_forget_reach_overdue_messages():
    node = ClaimSortNode(bake_time=1.0)
    for i in range(3):
        node.offer(msg(i), now=0.0)
    node.tick(2.0)
    assert node.overdue_ids() == ["m0", "m1", "m2"]
    assert ids(node.claim("m0", 0, msg(0).position)) == ["m0"]
    assert node.forget(["m2"]) == 1
    assert ids(node.rollback()) == ["m1"]


def test_replayed_entry_is_not_baked_twice():
    node = ClaimSortNode(bake_time=1.0)
    node.offer(msg(1), now=0.0)
    node.offer(msg(1), now=0.5)
    assert ids(node.rollback()) == ["m1"]


def test_full_at_max_pending():
    node = ClaimSortNode(bake_time=1.0, max_pending=2)
    node.offer(msg(1), now=0.0)
    assert not node.full
    node.offer(msg(2), now=0.0)
    assert node.full


events = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 1)),      # 1: already processed
        st.tuples(st.just("claim"), st.integers(0, 60)),      # claim the i-th offered so far
        st.tuples(st.just("tick"), st.floats(0, 3)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(events, st.lists(st.integers(0, 30), min_size=80, max_size=80))
def test_every_message_leaves_exactly_once_by_claim_or_rollback(evs, keys):
    """Conservation: bypass + claimed + rolled back == offered, each ID once."""
    clock = FakeClock()
    node = ClaimSortNode(bake_time=1.0)
    offered, bypassed, claimed = [], [], []
    for kind, arg in evs:
        if kind == "offer":
            m = msg(len(offered), key=keys[len(offered)])
            offered.append(m)
            if node.offer(m, clock.now(), processed=bool(arg)) == "bypass":
                bypassed.append(m)
        elif kind == "claim" and offered:
            c = offered[arg % len(offered)]
            got = node.claim(c.id, c.key, c.position)
            # Safety: a claim takes its own message, or ones at or below its key
            # and at or before it in the uplink; never one the master may not have processed.
            assert all(m.id == c.id or (m.key <= c.key and m.position <= c.position) for m in got)
            claimed += got
        elif kind == "tick":
            node.tick(clock.advance(arg))
    rolled = node.rollback()
    out = ids(bypassed) + ids(claimed) + ids(rolled)
    assert sorted(out) == sorted(ids(offered))
    assert len(out) == len(set(out))
    assert ids(rolled) == [m.id for m in offered if m.id in set(ids(rolled))]  # uplink order
