"""The lease watch (cluster/member_timers.py): a master whose Redis calls hang steps down about
one lease after Redis went silent, whatever its PING and its timer round wait for.

Found between lab hosts: a master whose packets to Redis were dropped, with Redis behind
Sentinels, never stepped down; its PING was still asking the Sentinels when 45 s had passed."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tests.conftest import wait_until
from twinflow.cluster.member_timers import LEASE_PING_S, MemberTimers


class Store:
    """A store that went silent ``silent_for`` seconds ago; its PING answers ``answers`` after
    ``ping_takes`` seconds (None: only when the test ends)."""

    def __init__(self, answers: bool, ping_takes: float | None):
        self.answers, self.ping_takes = answers, ping_takes
        self.silent_since = time.monotonic() - 10.0
        self.pings = 0
        self.released = threading.Event()

    def silent_s(self) -> float:
        return time.monotonic() - self.silent_since

    def ping(self) -> bool:
        self.pings += 1
        self.released.wait(self.ping_takes)
        if self.answers:
            self.silent_since = time.monotonic()
        return self.answers


class Member:
    """What the timers are handed of a member: its store, lease, election, stop event, event log
    and master side (whose step-down this records)."""

    def __init__(self, store: Store):
        self.store = store
        self.lease_s = 1.0
        self.cfg = SimpleNamespace(peer_id="peer-a")
        self.leadership = SimpleNamespace(is_master=True)
        self.stopping = threading.Event()
        self.stepped_down: list[tuple[str, float]] = []
        self.events: list[str] = []
        self.master = SimpleNamespace(step_down=self._step_down)
        self.timers = MemberTimers(self)

    def event(self, level, name, *args, **fields) -> None:
        self.events.append(name)

    def _step_down(self, reason: str) -> None:
        self.stepped_down.append((reason, time.monotonic()))
        self.leadership.is_master = False


def watch(member: Member) -> threading.Thread:
    thread = threading.Thread(target=member.timers.run_lease_watch, daemon=True)
    thread.start()
    return thread


def test_a_master_whose_ping_hangs_steps_down_within_a_lease_and_a_ping_wait():
    store = Store(answers=True, ping_takes=None)  # it would answer, but not before the test ends
    member = Member(store)
    started = time.monotonic()
    thread = watch(member)
    try:
        wait_until(lambda: member.stepped_down, 5.0, what="the master stepping down")
        reason, at = member.stepped_down[0]
        assert reason == "Redis unreachable" and member.events == ["lease_expired"]
        # A quarter lease to the first look, then the PING's wait; not the PING's own time.
        assert at - started < member.lease_s / 4 + LEASE_PING_S + 1.0
        assert store.pings == 1  # one PING waiting at a time, never a pile of them
    finally:
        member.stopping.set()
        store.released.set()
        thread.join(5)
    assert not thread.is_alive()


def test_a_master_whose_ping_answers_in_time_keeps_its_role():
    store = Store(answers=True, ping_takes=0.0)
    member = Member(store)
    thread = watch(member)
    try:
        wait_until(lambda: store.pings >= 1, 5.0, what="a PING")
        wait_until(lambda: store.silent_s() < member.lease_s, 5.0, what="the PING's answer")
        assert member.stepped_down == [] and member.leadership.is_master
    finally:
        member.stopping.set()
        thread.join(5)


def test_a_worker_is_not_watched():
    store = Store(answers=False, ping_takes=0.0)
    member = Member(store)
    member.leadership.is_master = False
    member.timers.check_lease()
    assert store.pings == 0 and member.stepped_down == []
