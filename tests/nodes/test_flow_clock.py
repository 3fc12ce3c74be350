"""The flow's clock (cluster/flow_clock.py): Redis's time as a peer estimates it, whatever its own
wall clock says. Pure: Redis's TIME, the monotonic clock and the wall clock are fakes, and a due
sample runs at once instead of on a thread."""

import logging
import threading

import pytest

from twinflow.cluster.flow_clock import RedisTimeClock


class World:
    """Redis's clock, this machine's monotonic and wall clocks, and a link with a round trip."""

    def __init__(self, redis_t=1_000_000.0, wall_ahead=0.0, round_trip=0.0):
        self.redis_t = redis_t        # Redis's time now
        self.mono = 50.0              # this machine's monotonic clock (an arbitrary origin)
        self.wall_ahead = wall_ahead  # how far this machine's wall clock is ahead of Redis's
        self.round_trip = round_trip
        self.calls = 0
        self.down = False

    def advance(self, s):
        self.redis_t += s
        self.mono += s

    def monotonic(self):
        return self.mono

    def wall(self):
        return self.redis_t + self.wall_ahead

    def time(self):
        """TIME: half the round trip there, the answer, half back."""
        self.calls += 1
        self.advance(self.round_trip / 2)
        if self.down:
            raise ConnectionError("Connection refused")
        answer = (int(self.redis_t), round((self.redis_t % 1) * 1e6))
        self.advance(self.round_trip / 2)
        return answer

    def clock(self, **kw):
        return RedisTimeClock(self.time, monotonic=self.monotonic, wall=self.wall, spawn=lambda fn: fn(), **kw)


@pytest.mark.parametrize("ahead", [5.0, -5.0, 3600.0])
def test_a_wall_clock_ahead_or_behind_gives_the_same_time(ahead):
    synced, skewed = World(), World(wall_ahead=ahead)
    a, b = synced.clock(), skewed.clock()
    for _ in range(30):
        assert a.now() == pytest.approx(synced.redis_t, abs=1e-6)
        assert b.now() == pytest.approx(skewed.redis_t, abs=1e-6)
        synced.advance(0.7)
        skewed.advance(0.7)
    assert b.offset_s == pytest.approx(ahead, abs=1e-6) and a.offset_s == pytest.approx(0.0, abs=1e-6)


def test_a_step_of_the_wall_clock_after_a_sample_changes_nothing():
    w = World()
    clock = w.clock()
    t0 = clock.now()
    w.wall_ahead = -120.0  # someone sets this machine's clock two minutes back
    w.advance(1.0)
    assert clock.now() == pytest.approx(t0 + 1.0)


def test_the_estimate_is_redis_time_at_the_midpoint_of_the_round_trip():
    w = World(round_trip=0.2)
    clock = w.clock()
    clock.now()
    assert clock.round_trip_s == pytest.approx(0.2)
    assert clock.now() == pytest.approx(w.redis_t, abs=1e-6)  # the link is symmetric: exact


def test_it_resamples_every_resample_s_not_on_every_call():
    w = World()
    clock = w.clock(resample_s=10.0)
    clock.now()
    first = w.calls
    assert first == 2  # the first sample is taken twice: the first round trip may include connecting
    for _ in range(79):  # steps of 1/8 s (exact in binary): 9.875 s, nothing due
        w.advance(0.125)
        clock.now()
    assert w.calls == first
    w.advance(0.125)  # 10 s: one sample
    clock.now()
    assert w.calls == first + 1
    for _ in range(80):
        w.advance(0.125)
        clock.now()
    assert w.calls == first + 2


def test_a_resample_follows_redis_when_its_clock_moves():
    w = World()
    clock = w.clock(resample_s=10.0)
    t0 = clock.now()
    w.redis_t += 2.0  # Redis's host was stepped forward (or the flow failed over to one ahead)
    w.advance(10.0)
    assert clock.now() == pytest.approx(t0 + 12.0)


def test_it_never_goes_backwards_and_holds_until_redis_catches_up():
    w = World()
    clock = w.clock(resample_s=10.0)
    clock.now()
    w.advance(9.875)
    last = clock.now()
    w.redis_t -= 3.0  # a failover to a Redis host 3 s behind
    w.advance(0.125)
    assert clock.now() == last  # resampled 3 s behind, 0.125 s on: held at the last answer
    seen = [last]
    for _ in range(40):
        w.advance(0.125)
        seen.append(clock.now())
    assert seen == sorted(seen)
    assert seen[22] == last and seen[24] > last  # held until Redis's time passed it: 2.875 s
    assert seen[-1] == pytest.approx(w.redis_t)


def test_a_failed_sample_keeps_the_estimate_and_is_retried_once_a_second():
    w = World()
    clock = w.clock(resample_s=10.0, retry_s=1.0)
    clock.now()
    w.advance(10.0)
    w.down = True
    calls = w.calls
    expected = clock.now()  # the sample due now fails: the estimate runs on
    assert expected == pytest.approx(w.redis_t) and w.calls == calls + 1
    for _ in range(25):  # 2.5 s of calls every 0.1 s: tried twice more, not 25 times
        w.advance(0.1)
        assert clock.now() == pytest.approx(w.redis_t)
    assert w.calls == calls + 3
    w.down = False
    w.advance(1.0)
    clock.now()
    assert w.calls == calls + 5  # back: sampled at once, twice (the connection is new)
    w.advance(5.0)
    clock.now()
    assert w.calls == calls + 5  # and then every resample_s again


def test_before_the_first_sample_it_is_the_wall_clock_then_held_until_redis_catches_up():
    w = World(wall_ahead=2.0)
    w.down = True
    clock = w.clock(retry_s=1.0)
    assert clock.now() == pytest.approx(w.redis_t + 2.0)  # Redis does not answer: this machine's clock
    assert clock.offset_s is None and clock.round_trip_s is None
    last = clock.now()
    w.down = False
    w.advance(1.0)
    assert clock.now() == pytest.approx(last)  # Redis answers: 1 s behind the fallback, so held
    assert clock.offset_s == pytest.approx(2.0)
    w.advance(1.5)
    assert clock.now() == pytest.approx(w.redis_t)


def test_sample_samples_now_and_says_whether_it_could():
    w = World()
    clock = w.clock(resample_s=10.0)
    assert clock.sample() and w.calls == 2
    w.advance(1.0)
    assert clock.sample() and w.calls == 3  # not due, sampled all the same
    w.down = True
    assert not clock.sample()
    assert clock.now() == pytest.approx(w.redis_t)


def test_an_answer_in_seconds_or_in_seconds_and_microseconds():
    w = World(redis_t=1_700_000_000.25)
    as_float = RedisTimeClock(lambda: w.redis_t, monotonic=w.monotonic, wall=w.wall, spawn=lambda fn: fn())
    as_pair = RedisTimeClock(lambda: (1_700_000_000, 250_000), monotonic=w.monotonic, wall=w.wall,
                             spawn=lambda fn: fn())
    assert as_float.now() == as_pair.now() == pytest.approx(1_700_000_000.25)


def test_an_offset_over_a_second_is_logged_once(caplog):
    w = World(wall_ahead=-4.0)
    clock = w.clock(resample_s=10.0, peer="a")
    with caplog.at_level(logging.WARNING, logger="twinflow.clock"):
        for _ in range(5):
            clock.now()
            w.advance(10.0)
    warned = [r for r in caplog.records if getattr(r, "event", None) == "clock_offset"]
    assert len(warned) == 1
    assert warned[0].seconds == pytest.approx(-4.0) and warned[0].peer == "a"
    assert "-4.000 s" in warned[0].getMessage() and "follows Redis" in warned[0].getMessage()
    w.wall_ahead = 0.0  # fixed (NTP) ...
    w.advance(10.0)
    clock.now()
    w.wall_ahead = 3.0  # ... and off again: said again
    with caplog.at_level(logging.WARNING, logger="twinflow.clock"):
        w.advance(10.0)
        clock.now()
    assert len([r for r in caplog.records if getattr(r, "event", None) == "clock_offset"]) == 2


def test_no_caller_waits_for_a_sample_and_threads_get_non_decreasing_times():
    """The default runs a due sample on a thread of its own: a TIME that hangs blocks no now()."""
    release, entered = threading.Event(), threading.Event()
    answers = iter([(1000, 0), (1000, 0)])

    def slow_time():
        try:
            return next(answers)
        except StopIteration:
            entered.set()
            release.wait(10)
            return (1005, 0)

    clock = RedisTimeClock(slow_time, resample_s=0.0)
    assert clock.sample()
    clock.now()  # due at once (resample_s=0): starts the sample that hangs
    assert entered.wait(5)
    seen = []

    def read():
        for _ in range(2000):
            seen.append(clock.now())

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(10)
    assert len(seen) == 8000 and all(t < 1002 for t in seen)  # none waited for the hanging TIME
    release.set()
    mine = [clock.now() for _ in range(1000)]
    assert mine == sorted(mine)
