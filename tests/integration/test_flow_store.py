"""The Redis store against a real redis-server: fencing, the ID cache, the processed mark, failures, outages."""

import os
import signal
import subprocess
import threading
import time

import pytest
import redis

from twinflow.testing.servers import free_port, redis_answers
from twinflow.cluster.master_flow import MasterFlow
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import DELIVER_MAX_BYTES, FlowStore, chunked
from twinflow.runtime.store.store_errors import Fenced, RedisUnavailable
from twinflow.runtime.store.step import Step
from tests.conftest import wait_until

DELIVER = parse_graph("flow: f\nuplink: {stream: uplink}\nnodes:\n  deliver: {type: action, sink: {stream: sink}}\n")


def deliver(store: FlowStore, epoch: int, messages: list[Message], **commit) -> list[bool]:
    """What a master does with a chunk: skip what the flow processed, run the rest, commit.
    Returns, per message, whether it was run (delivered) now."""
    done = store.processed(messages)
    fresh = [m for m, d in zip(messages, done) if not d]
    flow = MasterFlow(DELIVER.fresh(), store.keys, store.peer_id)
    store.commit(epoch, flow.run(fresh, 0.0, epoch, mark=messages[-1].position), **commit)
    return [not d for d in done]


def msgs(*ids, first: int = 1):
    """Messages at uplink positions first-0, first+1-0, ..."""
    return [Message(id=i, key=n, position=f"{n + first}-0", body=b'{"x":1}') for n, i in enumerate(ids)]


@pytest.fixture
def store(redis_url, flow_name):
    s = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "node-a", id_ttl=600)
    yield s
    s.close()


def test_deliver_records_ids_and_never_delivers_twice(store):
    store.raise_epoch(1)
    assert deliver(store, 1, msgs("a", "b")) == [True, True]
    assert deliver(store, 1, msgs("b", "c", first=3)) == [False, True]  # "b" again, later in the uplink
    sink = store.r.xrange(store.keys.sink)
    assert [f[b"id"] for _, f in sink] == [b"a", b"b", b"c"]
    assert {f[b"epoch"] for _, f in sink} == {b"1"}
    assert store.processed(msgs("a", "c", "zz")[:2]) == [True, True]
    assert store.processed([Message("zz", 9, "99-0", b"{}")]) == [False]
    assert 0 < store.r.ttl(store.keys.id_prefix + "a") <= 600  # bounded ID cache


def test_stale_epoch_changes_nothing(store):
    assert store.raise_epoch(3) == 3
    assert store.raise_epoch(2) == 3  # epochs never go back
    with pytest.raises(Fenced) as err:
        deliver(store, 2, msgs("a"))
    assert err.value.newest == 3
    assert store.r.xlen(store.keys.sink) == 0
    assert store.processed(msgs("a")) == [False]
    assert deliver(store, 3, msgs("a")) == [True]


def test_failures_are_recorded_once_whichever_node_sees_them(redis_url, flow_name):
    a = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "node-a")
    b = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "node-b")
    assert a.record_failures([("7-0", "body is not JSON", b"{", 1)]) == 1
    assert b.record_failures([("7-0", "body is not JSON", b"{", 1), ("8-0", "no key", None, None)]) == 1
    rows = a.r.xrange(a.keys.failure)
    assert [(f[b"position"], f[b"reason"]) for _, f in rows] == [(b"7-0", b"body is not JSON"), (b"8-0", b"no key")]


def test_an_entry_at_or_before_the_processed_mark_is_not_recorded_again_once_its_marker_expired(store):
    deliver(store, 1, msgs("a", "b", first=5))  # the mark is at 6-0
    store.r.delete(store.keys.failed_prefix + "5-0")  # its seen-marker expired (it lives id_ttl)
    assert store.record_failures([("5-0", "body is not JSON", b"{", 1), ("9-0", "body is not JSON", b"[", 1)]) == 1
    assert [f[b"position"] for _, f in store.r.xrange(store.keys.failure)] == [b"9-0"]


def test_the_handled_position_only_moves_forward(store):
    # A late attempt of a worker task that read an earlier batch records an older position.
    store.processed(msgs("a"), handled_upto="20-0")
    store.processed(msgs("b"), handled_upto="12-0")
    store.record_handled("15-0")
    assert store.handled_position() == "20-0"
    store.record_handled("21-0")
    assert store.handled_position() == "21-0"
    assert store.handled_positions([store.peer_id, "nobody"]) == {store.peer_id: "21-0", "nobody": None}
    # The record and the answer in one round trip: the answer still says what is processed.
    deliver(store, 1, msgs("c"))
    assert store.processed(msgs("c", "d"), handled_upto="30-0") == [True, False]
    assert store.handled_position() == "30-0"


def test_uplink_lag_counts_unread_entries(store):
    store.publish([b"{}"] * 5)
    assert store.uplink_lag("node-a") == 5
    store.r.hset(store.keys.read("node-a"), mapping={"read_n": 3, "read_id": "x"})
    assert store.uplink_lag("node-a") == 2


def test_uplink_behind_gives_the_lag_in_uplink_time(store):
    assert store.uplink_behind("node-a") == (0, 0.0)  # no uplink yet
    for ms in (1000, 2500, 4500):
        store.r.xadd(store.keys.uplink, {"data": b"{}"}, id=f"{ms}-0")
    # Nothing read yet: from the oldest entry to the newest.
    assert store.uplink_behind("node-a") == (3, 3.5)
    store.r.hset(store.keys.read("node-a"), mapping={"read_n": 1, "read_id": "1000-0"})
    assert store.uplink_behind("node-a") == (2, 3.5)
    store.r.hset(store.keys.read("node-a"), mapping={"read_n": 2, "read_id": "2500-0"})
    assert store.uplink_behind("node-a") == (1, 2.0)
    assert store.uplink_lag("node-a") == 1
    store.r.hset(store.keys.read("node-a"), mapping={"read_n": 3, "read_id": "4500-0"})
    assert store.uplink_behind("node-a") == (0, 0.0)


def test_delivery_waits_for_redis_and_loses_nothing(tmp_path):
    """Redis down when the write starts: the store waits and retries, then delivers once."""
    port = free_port()
    retries = []

    def sleep(seconds):
        retries.append(seconds)
        time.sleep(seconds)

    s = FlowStore(redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2), FlowKeys("down"), "node-a", sleep=sleep)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("flags", deliver(s, 0, msgs("a", "b"))))
    t.start()
    wait_until(lambda: len(retries) >= 1, 30, what="the store to retry")
    assert t.is_alive(), "delivery returned although Redis is down"
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: redis_answers(port), 10, what="redis-server")
        t.join(timeout=15)
        assert result["flags"] == [True, True]
        assert s.r.xlen(s.keys.sink) == 2
    finally:
        s.close()
        server.kill()
        server.wait()


def test_processed_mark_fences_reread_entries_after_their_ids_expired(store):
    """Defect 4: a peer that re-reads the uplink must not deliver again what the flow delivered,
    even once the IDs have left the ID cache."""
    store.raise_epoch(1)
    assert deliver(store, 1, msgs("a", "b")) == [True, True]
    assert store.processed_mark() == "2-0"
    store.r.delete(store.keys.id_prefix + "a", store.keys.id_prefix + "b")  # as if id_ttl passed
    assert deliver(store, 1, msgs("a", "b")) == [False, False]
    assert store.processed(msgs("a", "b")) == [True, True]  # a worker bypasses them too
    later = [Message("c", 5, "5-0", b"{}")]
    assert store.processed(later) == [False]
    assert deliver(store, 1, later) == [True]
    assert store.processed_mark() == "5-0"
    assert [f[b"id"] for _, f in store.r.xrange(store.keys.sink)] == [b"a", b"b", b"c"]


def test_a_delivery_restores_the_epoch_redis_lost(store):
    """Defect 7: if Redis loses the epoch, the newest master's next write puts it back."""
    assert store.raise_epoch(5) == 5
    store.r.delete(store.keys.epoch)  # Redis restarted without its data
    assert deliver(store, 5, msgs("a")) == [True]
    assert store.current_epoch() == 5
    with pytest.raises(Fenced):
        deliver(store, 3, [Message("b", 2, "9-0", b"{}")])


def test_redis_configuration_is_checked(store, own_redis):
    """Defect 7: eviction and missing persistence are reported; the test services pass."""
    assert store.config_problems() == []
    port, _ = own_redis("--maxmemory-policy", "allkeys-lru", "--appendonly", "no")
    bad = FlowStore(redis.Redis(port=port), FlowKeys("x"), "node-a").config_problems()
    assert len(bad) == 2
    assert "allkeys-lru" in bad[0] and "noeviction" in bad[0]
    assert "persistence is off" in bad[1]


def test_wait_replicas_confirms_the_delivery_reached_a_replica(primary_and_replica, flow_name):
    """Defect 7: with wait_replicas, deliver returns only once a replica has the delivery."""
    port, rport, replica = primary_and_replica
    s = FlowStore(redis.Redis(port=port, socket_timeout=2), FlowKeys(flow_name), "node-a")
    assert deliver(s, 1, msgs("a"), replicas=1, replica_wait_ms=2000) == [True]
    assert redis.Redis(port=rport).xlen(s.keys.sink) == 1  # already on the replica when deliver returned

    os.kill(replica.pid, signal.SIGSTOP)  # the replica stops acknowledging
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable) as err:
        deliver(s, 1, [Message("b", 2, "9-0", b"{}")], deadline_s=1.0, replicas=1, replica_wait_ms=200)
    assert "replicas" in str(err.value) and time.monotonic() - t0 < 5
    os.kill(replica.pid, signal.SIGCONT)
    # Nothing is lost: the delivery is in the primary, recorded once.
    assert deliver(s, 1, [Message("b", 2, "9-0", b"{}")], replicas=1, replica_wait_ms=5000) == [False]
    assert s.r.xlen(s.keys.sink) == 2


def test_a_handled_position_with_wait_replicas_is_on_a_replica_when_recorded(primary_and_replica, flow_name):
    """A master's batch runs ahead of its checkpoint once its handled position is recorded: with
    wait_replicas the record is on the replica by then, also when it changed nothing because a
    further position, written without WAIT by another connection, was there already (WAIT is
    documented for the client's own writes; the redis-server of these tests, 7.0, waits for
    everything written so far anyway, so this part checks the behaviour, not the marker that
    the durable write sends with its WAIT)."""
    port, rport, replica = primary_and_replica
    s = FlowStore(redis.Redis(port=port, socket_timeout=2), FlowKeys(flow_name), "node-a")
    on_replica = redis.Redis(port=rport)
    s.record_handled("5-0", replicas=1, replica_wait_ms=2000)
    assert on_replica.hget(s.keys.read("node-a"), "handled_id") == b"5-0"  # there when it returned

    os.kill(replica.pid, signal.SIGSTOP)  # the replica stops acknowledging
    try:
        # A worker's record (no WAIT), on a connection of its own.
        FlowStore(redis.Redis(port=port), FlowKeys(flow_name), "node-a").processed([], handled_upto="9-0")
        with pytest.raises(RedisUnavailable):  # 7-0 changes nothing, but 9-0 is not on the replica yet
            s.record_handled("7-0", deadline_s=1.0, replicas=1, replica_wait_ms=200)
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    s.record_handled("7-0", replicas=1, replica_wait_ms=5000)
    assert on_replica.hget(s.keys.read("node-a"), "handled_id") == b"9-0"
    assert s.handled_position() == "9-0"
    # A worker's record, as it bakes a batch, likewise (in the same round trip as its reads).
    assert s.processed(msgs("a"), handled_upto="12-0", replicas=1, replica_wait_ms=2000) == [False]
    assert on_replica.hget(s.keys.read("node-a"), "handled_id") == b"12-0"
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        with pytest.raises(RedisUnavailable):
            s.processed(msgs("a"), handled_upto="13-0", deadline_s=1.0, replicas=1, replica_wait_ms=200)
    finally:
        os.kill(replica.pid, signal.SIGCONT)


def test_failure_stream_is_capped_and_keeps_at_most_max_body_bytes(store):
    """Defect 6: the failure stream is bounded in entries and in body bytes."""
    bad = [(f"{n}-0", "body is not JSON", b"{" * 10, 10) for n in range(1, 1001)]
    assert store.record_failures(bad, max_entries=100) == 1000
    assert store.r.xlen(store.keys.failure) <= 300  # approximate trimming (whole stream nodes)
    big = b"x" * (2 << 20)
    store.record_failures([("2000-0", "message is too large", big, len(big))], max_entries=100, max_body=1024)
    _, last = store.r.xrevrange(store.keys.failure, count=1)[0]
    assert len(last[b"data"]) == 1024 and int(last[b"size"]) == len(big)


def test_chunks_bound_count_and_bytes():
    """Defect 10: delivery scripts are cut by bytes as well as count; one huge message goes alone."""
    small = [Message(f"s{i}", i, f"{i + 1}-0", b"x" * 10) for i in range(2500)]
    assert [len(c) for c in chunked(small)] == [1000, 1000, 500]
    big = [Message(f"b{i}", i, f"{i + 1}-0", b"x" * (6 << 20)) for i in range(5)]
    sizes = [sum(len(m.body) for m in c) for c in chunked(big)]
    assert all(size <= DELIVER_MAX_BYTES for size in sizes) and sum(sizes) == 5 * (6 << 20)
    huge = [Message("h", 1, "1-0", b"x" * (DELIVER_MAX_BYTES + 1))]
    assert [len(c) for c in chunked(huge)] == [1]


def test_delivery_of_messages_near_the_limit(store):
    """Defect 10: 40 messages of 1 MiB (the default max_bytes) are delivered in byte-bounded scripts."""
    body = b'{"id": "x", "pad": "' + b"x" * ((1 << 20) - 40) + b'"}'
    batch = [Message(f"m{i}", i, f"{i + 1}-0", body) for i in range(40)]
    flags = [f for chunk in chunked(batch) for f in deliver(store, 1, chunk)]
    assert flags == [True] * 40
    assert store.r.xlen(store.keys.sink) == 40


def test_publish_gives_up_at_its_deadline():
    """Defect 11: with Redis down, publish raises RedisUnavailable at its deadline instead of hanging."""
    s = FlowStore(redis.Redis(port=free_port(), socket_connect_timeout=0.2), FlowKeys("down"), "node-a")
    t0 = time.monotonic()
    with pytest.raises(RedisUnavailable):
        s.publish([b"{}"], deadline_s=0.5)
    assert time.monotonic() - t0 < 2.0


def test_a_step_writes_outputs_state_ids_and_mark_together_or_not_at_all(store):
    store.raise_epoch(2)
    store.commit(2, Step(mark="5-0", ids=["a"], outputs=[(store.keys.out("j", "joined"), {"id": "a+b"})],
                         state={"j": {"7": {"d": 1.5, "s": [["a", {}], None]}, "8": {"d": 2.0}}}))
    assert store.load_state_version(["j", "other"])[0] == {"j": {"7": {"d": 1.5, "s": [["a", {}], None]}, "8": {"d": 2.0}},
                                                 "other": {}}
    assert store.processed_mark() == "5-0" and store.processed([Message("a", None, "9-0", b"{}")]) == [True]
    store.commit(2, Step(mark="4-0", state={"j": {"8": None}}))  # the mark never goes back
    assert store.load_state_version(["j"])[0]["j"] == {"7": {"d": 1.5, "s": [["a", {}], None]}}
    assert store.processed_mark() == "5-0"
    # A stale writer changes nothing at all: no state, no output, no ID, no mark.
    store.raise_epoch(3)
    with pytest.raises(Fenced):
        store.commit(2, Step(mark="9-0", ids=["z"], outputs=[(store.keys.sink, {"id": "z"})], state={"j": {"7": None}}))
    assert store.load_state_version(["j"])[0]["j"] == {"7": {"d": 1.5, "s": [["a", {}], None]}}
    assert store.r.xlen(store.keys.sink) == 0 and store.processed_mark() == "5-0"
    assert store.processed([Message("z", None, "6-0", b"{}")]) == [False]
    assert store.r.xlen(store.keys.out("j", "joined")) == 1


@pytest.mark.parametrize("data", ["é ✓ 😀 \x00 \" \\ \u2028".encode(), "é".encode("utf-16")])
@pytest.mark.parametrize("epoch", [2, 2 ** 60])
def test_a_step_writes_every_value_to_the_byte(store, data, epoch):
    # Bodies in any encoding, text JSON must escape, integers past a double's 53 bits.
    store.raise_epoch(epoch)
    fields = {"node": "n1", "epoch": epoch, "id": "a", "data": data, "info": "{\"k\":\"\\u00e9\"}"}
    store.commit(epoch, Step(mark="5-0", ids=["a"], outputs=[(store.keys.sink, fields)],
                             state={"j": {"7": {"t": "é\u2028", "n": None}}}))
    (_, written), = store.r.xrange(store.keys.sink)
    assert written == {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}
    assert store.load_state_version(["j"])[0] == {"j": {"7": {"t": "é\u2028", "n": None}}}


class _RepliesLostOnce(redis.Redis):
    """A client whose first pipeline with a script runs on the server and then loses its reply."""

    lost = 0

    def pipeline(self, transaction=True, shard_hint=None):
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def reply_lost_once(raise_on_error=True):
            script = any(command[0][0] == "EVALSHA" for command in pipe.command_stack)
            result = execute(raise_on_error)
            if script and not self.lost:
                self.lost += 1
                raise redis.ConnectionError("reply lost after the server ran the script")
            return result

        pipe.execute = reply_lost_once
        return pipe


def test_a_commit_retried_after_its_reply_was_lost_is_applied_once(redis_url, flow_name):
    # Redis ran the step and only its reply was lost: the retry must find the step applied,
    # not run it again (its outputs twice in the sink).
    client = _RepliesLostOnce.from_url(redis_url)
    store = FlowStore(client, FlowKeys(flow_name), "n1", sleep=lambda s: None)
    assert deliver(store, 1, msgs("a", "b")) == [True, True]
    assert client.lost == 1  # the first attempt's reply was lost, and the store retried
    sink = client.xrange(store.keys.sink)
    assert [fields[b"id"] for _, fields in sink] == [b"a", b"b"]
    assert store.processed_mark() == "2-0"


def test_a_guessed_step_applies_only_while_the_guess_holds(store):
    # The master's one-round-trip commit: it assumes the mark it holds and that
    # its messages' IDs are new; Redis checks both in the same script.
    from twinflow.runtime.store.store_errors import GuessWrong
    store.raise_epoch(1)
    store.commit(1, Step(mark="2-0", ids=["a"], outputs=[(store.keys.sink, {"id": "a"})]), guess=(None,))
    assert store.processed_mark() == "2-0"
    wrong_mark = Step(mark="3-0", ids=["b"], outputs=[(store.keys.sink, {"id": "b"})])
    with pytest.raises(GuessWrong):
        store.commit(1, wrong_mark, guess=("1-0",))
    processed_id = Step(mark="3-0", ids=["b", "a"], outputs=[(store.keys.sink, {"id": "b"})])
    with pytest.raises(GuessWrong):
        store.commit(1, processed_id, guess=("2-0",))
    # Neither refused step wrote anything: no output, no ID, no mark.
    assert [f[b"id"] for _, f in store.r.xrange(store.keys.sink)] == [b"a"]
    assert store.processed_mark() == "2-0" and store.processed([Message("b", None, "9-0", b"{}")]) == [False]
    store.commit(1, wrong_mark, guess=("2-0",))
    assert [f[b"id"] for _, f in store.r.xrange(store.keys.sink)] == [b"a", b"b"]
    # The fence comes first: a stale writer is told so, not that it guessed wrong.
    store.raise_epoch(2)
    with pytest.raises(Fenced):
        store.commit(1, Step(mark="4-0", ids=["c"]), guess=("1-0",))


def test_the_state_is_read_with_the_mark_and_the_version(store):
    assert store.load_state_version(["j"]) == ({"j": {}}, None, 0)
    store.commit(1, Step(mark="5-0", state={"j": {"7": {"d": 1}}}))
    entries, mark, version = store.load_state_version(["j"])
    assert (entries, mark) == ({"j": {"7": {"d": 1}}}, "5-0") and version > 0


def test_the_uplink_is_trimmed_only_behind_the_mark_every_live_reader_and_the_retention(store):
    ids = store.publish([b"{}"] * 10)
    now = int(ids[-1].split("-")[0]) / 1000 + 0.5
    assert store.trim_uplink(["a"], 0, now) == (0, None)  # nothing processed yet: nothing goes
    store.commit(1, Step(mark=ids[6]))
    store.r.hset(store.keys.read("a"), "read_id", ids[8])
    assert store.trim_uplink(["a", "b"], 0, now) == (0, None)  # b has not recorded where it read
    store.r.hset(store.keys.read("b"), "read_id", ids[3])
    assert store.trim_uplink(["a", "b"], 3600, now) == (0, None)  # all younger than the retention
    assert store.r.xlen(store.keys.uplink) == 10 and store.trimmed_before() is None
    # The slowest live reader (b, at entry 3) holds the trim back; an entry it read stays (MINID keeps it).
    assert store.trim_uplink(["a", "b"], 0, now) == (3, ids[3])
    assert store.r.xrange(store.keys.uplink)[0][0].decode() == ids[3]
    # Without b (no longer live), the processed mark (entry 6) holds it back.
    assert store.trim_uplink(["a"], 0, now) == (3, ids[6])
    assert store.trimmed_before() == ids[6]
    # The record never moves back, whatever a later call finds.
    assert store.trim_uplink(["a", "b"], 0, now) == (0, ids[6])
    assert store.trimmed_before() == ids[6] and store.r.xlen(store.keys.uplink) == 4
