"""Claim-mode SortNode: bake, claim, surface unclaimed, rollback (fake clock, no servers)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from twinflow.runtime.clock import FakeClock
from twinflow.runtime.message import Message
from twinflow.runtime.positions import position_order
from twinflow.runtime.nodes.sort import ClaimSortNode


def msg(i: int, key: int | None = None) -> Message:
    return Message(id=f"m{i}", key=i if key is None else key, position=f"{1000 + i}-0", body=b"{}",
                   rule="all", cid=f"m{i}")


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


def test_a_message_a_claim_passed_over_is_claimed_by_a_later_one():
    node = ClaimSortNode(bake_time=5.0)
    node.offer(msg(1, key=10), now=0.0)
    node.offer(msg(2, key=5), now=0.0)
    assert ids(node.claim("m1", 10, msg(1).position)) == ["m1"]
    node.offer(msg(3, key=20), now=0.0)
    assert ids(node.claim("m3", 20, msg(3).position)) == ["m2", "m3"]


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


def test_claim_and_the_processed_mark_reach_overdue_messages():
    node = ClaimSortNode(bake_time=1.0)
    for i in range(4):
        node.offer(msg(i), now=0.0)
    assert len(node.tick(2.0)) == 4 and node.unclaimed == 4
    assert ids(node.claim("m0", 0, msg(0).position)) == ["m0"]
    claimed = node.claimed
    assert node.release_upto(msg(2).position) == 2  # m1, m2: at or before the mark
    assert node.claimed == claimed + 2  # a report is a notice: each message's one exit still counts
    assert ids(node.rollback()) == ["m3"]
    # Every exit counted once: 4 messages, 3 claimed and 1 rolled back, 4 notices before.
    assert (node.claimed, node.rolled_back, node.unclaimed, node.pending) == (3, 1, 4, 0)
    # And each notice is closed by how its message ended, once.
    assert [(m.id, how) for m, how in node.resolved()] == [
        ("m0", "claimed"), ("m1", "claimed"), ("m2", "claimed"), ("m3", "rolled_back")]
    assert node.resolved() == []


def test_a_message_no_baking_ruleset_takes_leaves_by_nohit():
    node = ClaimSortNode({"orders": 5.0, "payments": 1.0})
    assert node.offer(Message("x", None, "1-0", b"{}"), now=0.0) == "nohit"  # no ruleset took it
    assert node.offer(Message("c", 3, "2-0", b"{}", rule="escalations", cid="c"), now=0.0) == "nohit"  # a claim
    assert node.nohit == 2 and node.pending == 0
    assert node.rule_pending() == {"orders": 0, "payments": 0, "nohit": 0}


def test_a_claim_releases_in_its_own_ruleset_only():
    """Groups key their messages their own way: a claim of one never releases another's."""
    node = ClaimSortNode({"orders": 5.0, "payments": 5.0})
    node.offer(Message("o1", 1, "1-0", b"{}", rule="orders", cid="A-1"), now=0.0)
    node.offer(Message("p1", 1, "2-0", b"{}", rule="payments", cid="P-1"), now=0.0)
    node.offer(Message("o2", 2, "3-0", b"{}", rule="orders", cid="A-2"), now=0.0)
    assert node.rule_pending() == {"orders": 2, "payments": 1, "nohit": 0}
    assert ids(node.claim("A-2", 2, "3-0", "orders")) == ["o1", "o2"]
    assert node.rule_pending() == {"orders": 0, "payments": 1, "nohit": 0}
    # A claim ruleset's claim (or one naming no ruleset) claims in every group, as replay's one cache.
    assert ids(node.claim("P-1", 1, "3-0", "escalations")) == ["p1"]
    assert node.pending == 0


def test_each_ruleset_bakes_for_its_own_time():
    node = ClaimSortNode({"slow": 5.0, "quick": 1.0})
    node.offer(Message("s", 1, "1-0", b"{}", rule="slow", cid="s"), now=0.0)
    node.offer(Message("q", 2, "2-0", b"{}", rule="quick", cid="q"), now=0.0)
    assert node.next_deadline() == 1.0
    assert ids(node.tick(1.0)) == ["q"]
    assert node.next_deadline() == 5.0


def test_the_processed_mark_releases_baking_messages_as_claimed():
    node = ClaimSortNode(bake_time=10.0)
    for i in (3, 1, 2, 5):  # a replayed or late entry sits before later ones in the uplink
        node.offer(msg(i), now=0.0)
    assert node.release_upto(msg(3).position) == 3
    assert node.claimed == 3 and node.pending == 1
    assert node.release_upto(msg(3).position) == 0
    assert ids(node.rollback()) == ["m5"]


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


class ScanModel:
    """The claim node before it shared ClaimCache with the flow-file sort node: a plain
    scan of everything baked, too slow to keep, kept here as the behaviour to match (each
    message's exit counted once: a release by the mark counts an overdue message as claimed)."""

    def __init__(self, bake_time: float):
        self.bake_time = bake_time
        self.baked: dict[str, tuple[Message, float]] = {}   # position -> (message, ready_at)
        self.overdue: dict[str, Message] = {}
        self.claimed = self.unclaimed = self.rolled_back = 0

    def held(self):
        return [(p, e[0]) for p, e in self.baked.items()] + list(self.overdue.items())

    def offer(self, m, now, processed=False):
        if processed:
            self.claimed += 1
            return "bypass"
        if m.position not in self.baked and m.position not in self.overdue:
            self.baked[m.position] = (m, now + self.bake_time)
        return None

    def claim(self, msg_id, key, position):
        upto = position_order(position)
        take = [p for p, m in self.held() if m.id == msg_id or (m.key <= key and position_order(p) <= upto)]
        self.claimed += len(take)
        return [self._remove(p) for p in sorted(take, key=position_order)]

    def tick(self, now):
        ready = [p for p, (_, at) in self.baked.items() if at <= now]
        for p in ready:
            self.overdue[p] = self.baked.pop(p)[0]
        self.unclaimed += len(ready)
        return [self.overdue[p] for p in ready]

    def release_upto(self, position):
        upto = position_order(position)
        take = [p for p, _ in self.held() if position_order(p) <= upto]
        self.claimed += len(take)  # an overdue one too: its report was a notice, this its exit
        for p in take:
            self._remove(p)
        return len(take)

    def rollback(self):
        out = [m for _, m in sorted(self.held(), key=lambda e: position_order(e[0]))]
        self.baked.clear()
        self.overdue.clear()
        self.rolled_back += len(out)
        return out

    def next_deadline(self):
        return min((at for _, at in self.baked.values()), default=None)

    def _remove(self, p):
        return self.baked.pop(p)[0] if p in self.baked else self.overdue.pop(p)


model_ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 30), st.booleans()),   # new entry: key, processed
        st.tuples(st.just("reread"), st.integers(0, 99), st.just(False)),  # an earlier entry read again
        st.tuples(st.just("claim"), st.integers(0, 99), st.booleans()),   # True: a foreign ID, same key/position
        st.tuples(st.just("tick"), st.sampled_from([0.0, 0.4, 1.0, 2.5]), st.just(False)),
        st.tuples(st.just("mark"), st.integers(0, 99), st.just(False)),
        st.tuples(st.just("rollback"), st.just(0), st.just(False)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(model_ops)
def test_the_claim_node_behaves_like_the_plain_scan(ops):
    """Same returns, counters and deadline as the scan it replaced, after every step."""
    clock = FakeClock()
    node, model = ClaimSortNode(bake_time=1.0), ScanModel(bake_time=1.0)
    offered: list[Message] = []
    for kind, a, b in ops:
        if kind == "offer":
            offered.append(msg(len(offered), key=a))
            got = node.offer(offered[-1], clock.now(), b), model.offer(offered[-1], clock.now(), b)
        elif kind == "reread" and offered:
            m = offered[a % len(offered)]
            got = node.offer(m, clock.now()), model.offer(m, clock.now())
        elif kind == "claim" and offered:
            c = offered[a % len(offered)]
            cid = "elsewhere" if b else c.id
            got = ids(node.claim(cid, c.key, c.position)), ids(model.claim(cid, c.key, c.position))
        elif kind == "tick":
            clock.advance(a)
            got = ids(node.tick(clock.now())), ids(model.tick(clock.now()))
        elif kind == "mark" and offered:
            p = offered[a % len(offered)].position
            got = node.release_upto(p), model.release_upto(p)
        elif kind == "rollback":
            got = ids(node.rollback()), ids(model.rollback())
        else:
            continue
        assert got[0] == got[1], kind
        assert (node.claimed, node.unclaimed, node.rolled_back) == (model.claimed, model.unclaimed, model.rolled_back)
        assert (node.baked, node.pending) == (len(model.baked), len(model.baked) + len(model.overdue))
        assert node.next_deadline() == model.next_deadline()



def test_a_claim_taken_as_a_hint_releases_only_what_is_proven():
    """take_claims/settle_claims (the cluster's worker): the unproven bake on, claimable later,
    and a message that left meanwhile (the processed mark) is not released twice."""
    node = ClaimSortNode(bake_time=5.0)
    for i in range(1, 5):
        node.offer(Message(f"m{i}", i, f"{i}-0", b"{}", rule="all", cid=f"m{i}"), now=0.0)
    taken = node.take_claims([("m3", 3, "3-0", "all")])  # would release m1..m3
    assert [m.id for m in node.claimed_messages(taken)] == ["m1", "m2", "m3"]
    assert node.release_upto("1-0") == 1  # m1 leaves by the mark while the claim is being proven
    released = node.settle_claims(taken, [True, False, True])
    assert [m.id for m in released] == ["m3"]
    assert node.pending == 2 and node.claimed == 2  # m1 by the mark, m3 by the claim
    # m2 went back to baking: a later proven claim still releases it, and m4 stays.
    again = node.take_claims([("m2", 2, "2-0", "all")])
    assert [m.id for m in node.settle_claims(again, [True] * len(again))] == ["m2"]
    assert [m.id for m in node.rollback()] == ["m4"]
