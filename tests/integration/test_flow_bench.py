"""The floor ``twinflow bench flow-vs-passthrough`` measures the pair against: two bare readers,
each in a process of its own with its own Spark driver, copying one uplink at once."""

from __future__ import annotations

import pytest
import redis

from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow_dev.bench_stats import median, spread, summarise
from twinflow_dev.flow_bench import Load, per_message_us, settled, two_passthroughs
from twinflow.testing.messages import CHAINED
from twinflow.testing.proc_stats import TICKS


def test_two_bare_readers_each_copy_the_whole_uplink_and_their_cpu_is_counted(redis_url):
    out = two_passthroughs(redis_url, Load(messages=3000, rounds=2, batch_size=1000))
    client = redis.Redis.from_url(redis_url)
    # Both bursts, whole, in each sink, in uplink order.
    assert client.xlen("pt:two:sink1") == 6000 and client.xlen("pt:two:sink2") == 6000
    assert [e[1][b"position"] for e in client.xrange("pt:two:sink2")] == [e[0] for e in client.xrange("pt:two:uplink")]
    # Each burst was timed, and the readers' CPU was counted (a tree not found would give 0).
    assert len(out["burst_msgs_per_s"]) == 2 and all(rate > 0 for rate in out["burst_msgs_per_s"])
    assert out["cpu_us_per_msg"] > 0 and out["batch_size"] == 1000


def test_a_figure_is_the_median_and_spread_of_its_rounds_and_a_bench_needs_one():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0]) == 2.5
    assert spread([10.0, 8.0, None, 12.0]) == {"median": 10.0, "min": 8.0, "max": 12.0, "spread": 0.4, "runs": 3}
    assert spread([None]) is None
    out = summarise([{"a": 1.0, "b": None, "ok": True}, {"a": 3.0, "b": 2.0}])
    assert out["a"]["median"] == 2.0 and out["b"]["runs"] == 1 and "ok" not in out
    with pytest.raises(ValueError, match="one round"):
        Load(rounds=0)


def test_cpu_ticks_per_message_in_microseconds():
    assert per_message_us(TICKS, 1000) == 1000.0  # one second of CPU over 1,000 messages


def test_the_pair_is_settled_once_both_readers_are_past_the_last_message_and_no_join_group_is_open(redis_url):
    client = redis.Redis.from_url(redis_url)
    graph, keys = parse_graph(CHAINED.read_text()), FlowKeys("settle-test")
    peers = ["peer-a", "peer-b"]

    def now() -> bool:
        return settled(client, keys, graph, peers, "7-0")

    assert not now()  # no reader has said how far it read
    client.hset(keys.read("peer-a"), "read_id", "5-0")
    client.hset(keys.read("peer-b"), "read_id", "9-0")
    assert not now()  # peer-a is behind
    client.hset(keys.read("peer-a"), "read_id", "7-0")
    client.hset(keys.state("match"), "42", "{}")  # a join group waiting for its payment or time-out
    client.hset(keys.state("guard"), '["guard","order-1"]', "[1.0,true,true]")  # the history keeps its own
    assert not now()
    client.hdel(keys.state("match"), "42")
    assert now()
