"""The retention of the streams a flow writes, on a real Redis (runtime/store/stream_retention.py):
each stream trimmed to its count and age, and every entry removed after the smallest
last-delivered-id of its consumer groups counted as unread, in Redis, exactly once."""

from __future__ import annotations

import random

import pytest

from twinflow.runtime.store.stream_retention import trim_streams
from twinflow.runtime.stream_spec import Retention

NOW_S = 1000.0  # the flow's time: entry "<ms>-0" is (NOW_S * 1000 - ms) ms old


def fill(r, key: str, n: int, start_ms: int = 100_000) -> list[str]:
    """``n`` entries one second apart, the last one at ``start_ms + (n - 1) * 1000``."""
    return [r.xadd(key, {"data": "{}"}, id=f"{start_ms + i * 1000}-0").decode() for i in range(n)]


def read(r, key: str, group: str, count: int) -> None:
    """Group ``group`` (made at the start of the stream) reads ``count`` entries: its lag is known."""
    r.xgroup_create(key, group, id="0")
    if count:
        r.xreadgroup(group, "c", {key: ">"}, count=count)


def ids(r, key: str) -> list[str]:
    return [i.decode() for i, _ in r.xrange(key)]


def trim(store, name: str, max_entries=None, retention=None, budget=5000):
    (result,) = trim_streams(store, [(name, Retention(max_entries, retention))], NOW_S, budget=budget)
    return result


def test_a_stream_without_a_consumer_group_is_trimmed_and_nothing_counts_as_unread(store):
    r, key = store.r, store.keys.stream("sink")
    entries = fill(r, key, 10)
    t = trim(store, "sink", max_entries=4)
    assert ids(r, key) == entries[6:]
    assert (t.removed, t.unread, t.grouped, t.entries, t.removed_total, t.unread_total) == (6, 0, False, 4, 6, 0)
    assert r.hget(store.keys.streams_trimmed, "sink") == b"6" and r.hget(store.keys.streams_unread, "sink") is None


def test_a_group_that_read_nothing_makes_every_removed_entry_unread(store):
    r, key = store.r, store.keys.stream("out:guard:failure")
    fill(r, key, 10)
    read(r, key, "billing", 0)
    t = trim(store, "out:guard:failure", max_entries=7)
    assert (t.removed, t.unread, t.grouped, t.entries) == (3, 3, True, 7)
    assert r.hget(store.keys.streams_unread, "out:guard:failure") == b"3"


def test_the_count_bound_removes_what_the_slowest_group_read_first_then_counts_the_rest(store):
    r, key = store.r, store.keys.stream("sink")
    entries = fill(r, key, 10)
    read(r, key, "fast", 9)
    read(r, key, "slow", 4)  # the smallest last-delivered-id: entries[3]
    t = trim(store, "sink", max_entries=3)
    assert ids(r, key) == entries[7:]
    assert (t.removed, t.unread) == (7, 3)  # entries[4..6]: removed before "slow" read them
    again = trim(store, "sink", max_entries=3)  # a retry after a lost reply: nothing more, counted once
    assert (again.removed, again.unread, again.removed_total, again.unread_total) == (0, 0, 7, 3)


def test_the_age_bound_counts_what_is_older_than_the_retention_and_unread(store):
    r, key = store.r, store.keys.stream("sink")
    entries = fill(r, key, 10, start_ms=900_000)  # 100 s .. 91 s old
    read(r, key, "g", 2)
    t = trim(store, "sink", retention=95)  # the first five are older than 95 s
    assert ids(r, key) == entries[5:]
    assert (t.removed, t.unread) == (5, 3)
    assert trim(store, "sink", retention=95).removed == 0


def test_a_group_ahead_of_everything_removed_counts_nothing(store):
    r, key = store.r, store.keys.stream("notices")
    fill(r, key, 10)
    r.xgroup_create(key, "late", id="$")  # made after the entries: it reads only newer ones
    t = trim(store, "notices", max_entries=2, retention=60)
    assert (t.removed, t.unread, t.entries) == (10, 0, 0)  # all older than 60 s, none for the group


def test_without_a_lag_the_read_entries_are_counted_a_budget_at_a_time(store):
    r, key = store.r, store.keys.stream("sink")
    entries = fill(r, key, 30)
    r.xgroup_create(key, "g", id=entries[19])  # at an ID of its own: Redis cannot tell its lag
    assert r.xinfo_groups(key)[0]["lag"] is None
    first = trim(store, "sink", max_entries=5, budget=8)
    assert (first.removed, first.unread, first.more) == (8, 0, True)  # eight read entries, then stop
    rest = [trim(store, "sink", max_entries=5, budget=8) for _ in range(3)]
    assert [t.more for t in rest] == [True, False, False]
    assert ids(r, key) == entries[25:]
    assert (rest[-2].removed_total, rest[-2].unread_total) == (25, 5)  # entries[20..24] never read by g


def test_a_stream_that_does_not_exist_is_left_alone(store):
    t = trim(store, "out:x:done", max_entries=1, retention=60)
    assert (t.removed, t.unread, t.entries, t.removed_total) == (0, 0, 0, 0)
    assert not store.r.exists(store.keys.stream("out:x:done"))


def test_one_round_trims_every_stream_it_is_given(store):
    r = store.r
    for name in ("sink", "failure"):
        fill(r, store.keys.stream(name), 6)
    done = trim_streams(store, [("sink", Retention(2, None)), ("failure", Retention(None, 60.0))], NOW_S)
    assert [(t.stream, t.removed) for t in done] == [("sink", 4), ("failure", 6)]


@pytest.mark.parametrize("seed", range(16))
def test_the_counts_are_those_of_a_brute_force_count(store, seed):
    """Random streams, groups (lag known or not), bounds and budgets: the entries kept and the
    counts are what removing each due entry one by one, and asking whether a group read it, gives."""
    rnd = random.Random(seed)
    r, key = store.r, store.keys.stream("sink")
    entries = fill(r, key, rnd.randint(1, 60), start_ms=rnd.choice([850_000, 920_000, 950_000]))
    positions = []
    for g in range(rnd.randint(0, 3)):
        k = rnd.randint(0, len(entries))
        if rnd.random() < 0.5:
            read(r, key, f"g{g}", k)
        else:
            r.xgroup_create(key, f"g{g}", id=entries[k - 1] if k else "0-0")
        positions.append(k)  # entries[:k] read by this group
    max_entries = rnd.choice([None, rnd.randint(1, 40)])
    retention = rnd.choice([None, float(rnd.randint(60, 120))]) if max_entries else float(rnd.randint(60, 120))
    cut = NOW_S * 1000 - retention * 1000 if retention else -1
    due = [i for i, e in enumerate(entries) if int(e.split("-")[0]) < cut]
    kept = [i for i in range(len(entries)) if i not in due]
    if max_entries is not None and len(kept) > max_entries:
        due += kept[:len(kept) - max_entries]
    want_unread = sum(1 for i in due if i >= min(positions)) if positions else 0
    budget = rnd.choice([1, 3, 5000])
    total = None
    for _ in range(100):
        t = trim(store, "sink", max_entries, retention, budget)
        total = t
        if not t.more:
            break
    assert ids(r, key) == [e for i, e in enumerate(entries) if i not in due]
    assert (total.removed_total, total.unread_total) == (len(due), want_unread)
