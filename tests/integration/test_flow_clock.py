"""The flow's clock (cluster/flow_clock.py) against real redis-server processes: its estimate is
Redis's TIME; the peer's parts (``RealParts``) build one per peer through a client made as the
store's is (the password from the environment); under Sentinel it follows the primary through
a failover; status and metrics show its offset."""

from __future__ import annotations

import logging
import secrets
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.integration.test_escalation_admission import NoSpark
from twinflow.cluster.flow_clock import RedisTime, RedisTimeClock
from twinflow.cluster.peer import Peer
from twinflow.cluster.peer_config import PeerConfig
from twinflow.cluster.real_parts import RealParts
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.redis_auth import ENV_PASSWORD
from twinflow.testing.redis_ha import LocalSentinel
from twinflow.testing.services import LocalRedis

CLOSE_S = 0.05  # how near Redis's TIME the estimate must be (on loopback it is within a millisecond)

FLOW = """\
flow: {name}
uplink: {{stream: uplink{shards}}}
message: {{id: id}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
cluster: {{redis_checks: warn}}
"""


def redis_time(client: redis.Redis) -> float:
    sec, usec = client.time()
    return sec + usec / 1e6


def assert_near_redis(clock, client: redis.Redis) -> None:
    before = redis_time(client)
    estimate = clock.now()
    after = redis_time(client)
    assert before - CLOSE_S <= estimate <= after + CLOSE_S, (before, estimate, after)


def test_the_estimate_is_redis_time(redis_url):
    source = RedisTime(redis_url)
    clock = RedisTimeClock(source)
    try:
        assert clock.sample()
        assert clock.round_trip_s < CLOSE_S and abs(clock.offset_s) < CLOSE_S  # one machine: one clock
        client = redis.Redis.from_url(redis_url)
        for _ in range(5):
            assert_near_redis(clock, client)
            time.sleep(0.02)
    finally:
        source.close()


@pytest.fixture(scope="module")
def locked_redis(tmp_path_factory):
    """A redis-server that asks for a password."""
    server = LocalRedis.start(str(tmp_path_factory.mktemp("clock-redis")), password="pw-" + secrets.token_hex(12),
                              deadline_s=10)
    yield server
    server.stop()


def peer_clock(url: str, password: str, flow_name: str, tmp_path, monkeypatch):
    """A peer's parts and flow clock on ``url``, the password given as the peers are (by reference)."""
    monkeypatch.setenv("TF_TEST_CLOCK_PW", password)
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_CLOCK_PW")
    graph = parse_graph(FLOW.format(name=flow_name, shards=""))
    cfg = PeerConfig(peer_id="a", redis_url=url, zk_hosts="unused", state_dir=str(tmp_path))
    parts = RealParts()
    return parts, parts.clock(graph, cfg), (graph, cfg)


def test_the_peers_clock_reads_time_with_the_stores_password(locked_redis, flow_name, tmp_path, monkeypatch,
                                                             caplog):
    parts, clock, (graph, cfg) = peer_clock(locked_redis.url, locked_redis.password, flow_name, tmp_path, monkeypatch)
    assert parts.clock(graph, cfg) is clock  # one per peer
    try:
        assert clock.sample() and abs(clock.offset_s) < CLOSE_S
        assert_near_redis(clock, redis.Redis(port=locked_redis.port, password=locked_redis.password))
    finally:
        parts.close()

    # Without the password TIME is refused: the clock says so once, without the password,
    # and runs on this machine's clock until Redis answers.
    monkeypatch.delenv(ENV_PASSWORD)
    bare = RealParts().clock(graph, cfg)
    with caplog.at_level(logging.INFO, logger="twinflow.clock"):
        assert not bare.sample()
        assert bare.now() == pytest.approx(time.time(), abs=0.5) and bare.offset_s is None
    assert "cannot read Redis's time" in caplog.text and "AuthenticationError" in caplog.text
    assert locked_redis.password not in caplog.text


def test_members_share_one_clock_and_show_its_offset(redis_url, zk_hosts, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name, shards=", shards: 2, shard_key: \"{id}\""))
    cfg = PeerConfig(peer_id="a", redis_url=redis_url, zk_hosts=zk_hosts, state_dir=str(tmp_path),
                     spark_master="local[1]", metrics_listen="127.0.0.1:0")
    parts = NoSpark()
    peer = Peer.for_flow(graph, cfg, parts=parts)
    assert len(peer.members) == 2 and all(m.clock is parts.flow_clock for m in peer.members)
    assert parts.flow_clock.offset_s is None  # nothing connects before the peer starts
    try:
        peer.start()
        assert parts.flow_clock.offset_s is not None  # sampled as the first store opened
        status = peer.status()
        assert abs(status["clock_offset_s"]) < CLOSE_S
        with urllib.request.urlopen(f"http://{peer.metrics.address}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        gauges = {s.labels["flow"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name == "twinflow_clock_offset_seconds"}
        assert set(gauges) == {m.name for m in peer.members} and all(abs(v) < CLOSE_S for v in gauges.values())
        wait_until(lambda: "clock_offset_s" in peer.members[0].store.read_statuses()[0], 10.0,
                   what="the status hash to carry the offset")
    finally:
        peer.stop()
    page = (Path(__file__).parents[2] / "docs" / "reference" / "metrics.md").read_text()
    assert "| `twinflow_clock_offset_seconds` |" in page


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory):
    group = LocalSentinel.start(str(tmp_path_factory.mktemp("clock-sentinel")), replicas=1, sentinels=3,
                                password="pw-" + secrets.token_hex(8))
    yield group
    group.stop()


def test_under_sentinel_it_follows_the_primary_through_a_failover(sentinel_group, flow_name, tmp_path,
                                                                  monkeypatch):
    group = sentinel_group
    parts, clock, _ = peer_clock(group.url, group.password, flow_name, tmp_path, monkeypatch)
    source = parts._redis_time  # noqa: SLF001 (which server it reads)

    def served_by() -> int:
        return source.client.connection_pool.get_master_address()[1]

    try:
        assert group.primary() == 0
        assert clock.sample() and served_by() == group.servers[0].port
        # A failover the Sentinels run with the old primary alive: it becomes a replica (which
        # answers TIME too), and the clock must go on reading the new primary's.
        sentinel = redis.Redis(port=group.sentinels[0].port, socket_timeout=2)
        sentinel.execute_command("SENTINEL", "FAILOVER", group.service)
        wait_until(lambda: group.primary() == 1, 30.0, what="the Sentinels to promote the replica")
        wait_until(lambda: clock.sample() and served_by() == group.servers[1].port, 30.0, interval_s=0.2,
                   what="the clock to read the new primary")
        role = source.client.execute_command("ROLE")[0]  # the connection TIME used
        assert role in (b"master", "master")
        assert_near_redis(clock, redis.Redis(port=group.servers[1].port, password=group.password))
    finally:
        parts.close()
