"""The durable write (``runtime/store/durable.py``) against real redis-servers: one round trip
when the replicas confirm, one deadline on the store's injected clock, only the confirmation
sent again after a short count, the write sent again when the primary no longer has it, a
refused write not waited for.

Real servers: a redis-server of the test's own, alone or with one replica (stopped with
SIGSTOP so that WAIT cannot be satisfied, continued with SIGCONT); time is a FakeClock whose
sleeps advance it, so the deadlines are exact and cost no waiting.
"""

import os
import signal
import time

import pytest
import redis

from twinflow.runtime.clock import FakeClock
from twinflow.runtime.store.durable import ReplicasShort
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.step import Step
from twinflow.runtime.store.store_errors import Fenced, RedisUnavailable


class Recording(redis.Redis):
    """A client that records the commands of every pipeline it sends, one list per round trip."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[list[tuple]] = []

    def pipeline(self, transaction=True, shard_hint=None):
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def recorded(raise_on_error=True):
            self.sent.append([command[0] for command in pipe.command_stack])
            return execute(raise_on_error)

        pipe.execute = recorded
        return pipe

    def execute_command(self, *args, **options):
        self.sent.append([args])  # a command sent by itself: a round trip of its own
        return super().execute_command(*args, **options)

    def names(self) -> list[list[str]]:
        return [[str(args[0]) for args in trip] for trip in self.sent]


def store_on(port: int, flow_name: str, clock: FakeClock | None = None, on_sleep=None) -> FlowStore:
    clock = clock or FakeClock()

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if on_sleep is not None:
            on_sleep()

    store = FlowStore(Recording(port=port, socket_timeout=5), FlowKeys(flow_name), "node-a",
                      sleep=sleep, monotonic=clock.now)
    for script in store.scripts.values():  # loaded, as on a Redis the flow has run on
        store.r.script_load(script.script)
    store.r.sent.clear()
    return store


def test_a_confirmed_write_takes_one_round_trip_and_is_on_the_replica_when_it_returns(
        primary_and_replica, flow_name):
    port, rport, _ = primary_and_replica
    store = store_on(port, flow_name)
    store.r.config_resetstat()
    store.r.sent.clear()
    positions = store.publish([b'{"id": "a"}', b'{"id": "b"}'], replicas=1, replica_wait_ms=2000)
    assert store.epoch_seen == 0 and store.raise_epoch(4, replicas=1, replica_wait_ms=2000) == 4
    assert store.r.names() == [["XADD", "XADD", "SET", "WAIT"], ["EVALSHA", "SET", "WAIT"]]
    on_replica = redis.Redis(port=rport)
    assert [p.decode() for p, _ in on_replica.xrange(store.keys.uplink)] == positions
    assert on_replica.get(store.keys.epoch) == b"4"
    # EVALSHA went alone: no SCRIPT EXISTS round trip before it.
    assert not any(k.startswith("cmdstat_script") for k in store.r.info("commandstats"))


def test_a_write_sent_by_itself_is_confirmed_in_the_next_round_trip(primary_and_replica, flow_name):
    port, rport, _ = primary_and_replica
    store = store_on(port, flow_name)
    assert store.record_failures([("7-0", "body is not JSON", b"{", 1)], replicas=1, replica_wait_ms=2000) == 1
    assert store.r.names() == [["EVALSHA"], ["SET", "WAIT"]]
    assert redis.Redis(port=rport).xlen(store.keys.failure) == 1


def test_a_short_count_sends_only_the_confirmation_again_until_the_deadline(own_redis, flow_name):
    port, _ = own_redis()  # no replica: every WAIT for one comes back short
    clock = FakeClock()
    store = store_on(port, flow_name, clock)
    with pytest.raises(RedisUnavailable) as err:
        store.publish([b'{"id": "a"}'], deadline_s=2.0, replicas=1, replica_wait_ms=5)
    assert isinstance(err.value.last, ReplicasShort) and "0 of 1 replicas" in str(err.value)
    assert clock.now() == pytest.approx(2.0) and err.value.waited_s == pytest.approx(2.0)
    trips = store.r.names()
    assert trips[0] == ["XADD", "SET", "WAIT"]  # the write, once
    assert len(trips) > 2 and all(t == ["SET", "WAIT"] for t in trips[1:])  # then confirmations only
    assert all(trip[0][-1] == "XX" for trip in store.r.sent[1:])  # each only while the marker is there
    assert store.r.xlen(store.keys.uplink) == 1  # the entry is in the primary, once


def test_each_wait_ends_by_the_deadline(own_redis, flow_name):
    port, _ = own_redis()
    clock = FakeClock()
    store = store_on(port, flow_name, clock)
    asked: list[tuple[float, int]] = []  # (clock, WAIT timeout in ms) per round trip
    send = store._send

    def spy(write, *commands):
        asked.append((clock.now(), int(commands[-1][2])))
        return send(write, *commands)

    store._send = spy
    with pytest.raises(RedisUnavailable):
        store.raise_epoch(1, deadline_s=0.3, replicas=1, replica_wait_ms=60_000)
    assert asked[0] == (0.0, 300)
    for at, wait_ms in asked:
        assert abs(wait_ms - max(1.0, (0.3 - at) * 1000)) <= 1  # the time left, to the ms
    assert asked[-1][1] == 1  # the last one, at the deadline: WAIT 0 would block for ever


def test_a_write_the_primary_lost_is_sent_again(primary_and_replica, flow_name):
    port, rport, replica = primary_and_replica
    primary = redis.Redis(port=port)
    flow = FlowKeys(flow_name)

    lost = []

    def failover_lost_it():
        # What a failover to a replica that had not received the write leaves: neither the
        # write nor its marker on the primary that answers now. Then the replica acknowledges:
        # the next try is not sent before it does, however slowly the machine resumes it.
        if lost:
            return
        lost.append(True)
        primary.delete(flow.epoch, *primary.keys(flow.prefix + "sync:*"))
        os.kill(replica.pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while primary.wait(1, 100) < 1:
            assert time.monotonic() < deadline, "the resumed replica never acknowledged"

    store = store_on(port, flow_name, on_sleep=failover_lost_it)
    os.kill(replica.pid, signal.SIGSTOP)
    assert store.raise_epoch(5, deadline_s=30, replicas=1, replica_wait_ms=50) == 5
    assert store.r.names() == [["EVALSHA", "SET", "WAIT"], ["SET", "WAIT"], ["EVALSHA", "SET", "WAIT"]]
    assert redis.Redis(port=rport).get(flow.epoch) == b"5"


def test_a_refused_write_is_not_waited_for(own_redis, flow_name):
    port, _ = own_redis()  # no replica: a WAIT would come back short
    clock = FakeClock()
    store = store_on(port, flow_name, clock)
    store.raise_epoch(3)
    with pytest.raises(Fenced):
        store.commit(2, Step(mark="1-0", ids=["a"]), deadline_s=5.0, replicas=1, replica_wait_ms=5)
    assert clock.now() == 0.0 and len(store.r.sent) == 2  # the epoch, then the refused step alone


def test_a_script_redis_does_not_know_is_loaded_and_sent_again(own_redis, flow_name):
    port, _ = own_redis()
    store = store_on(port, flow_name)
    store.r.script_flush()  # as on a Redis just promoted or restarted
    store.r.sent.clear()
    assert store.raise_epoch(2) == 2
    loads = [["SCRIPT LOAD"]] * len(store.scripts)
    assert store.r.names() == [["EVALSHA"], *loads, ["EVALSHA"]]
