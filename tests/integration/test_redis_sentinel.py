"""Redis Sentinel: a ``redis+sentinel://`` URL (with the password from the environment) gives the
store the primary the Sentinels name, and after a SIGKILL of that primary the same store finds the
promoted replica within its call's deadline. Real servers on 127.0.0.1: a primary, a replica and
three Sentinels (``redis-server sentinel.conf --sentinel``), stopped by PID."""

from __future__ import annotations

import time

import pytest
import redis

from tests.conftest import wait_until
from twinflow.cluster.connect import connect_redis
from twinflow.testing.redis_ha import LocalSentinel
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.store_errors import RedisUnavailable
from twinflow.runtime.store.redis_auth import RedisSettingsError, client_options
from twinflow.runtime.store.redis_slot import client_from_url, is_sentinel_url, parse_sentinel_url

PASSWORD = "s3cret pw"


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory):
    group = LocalSentinel.start(str(tmp_path_factory.mktemp("sentinel")), replicas=1, sentinels=3,
                                password=PASSWORD)
    yield group
    group.stop()


def test_sentinel_urls_in_both_forms_and_what_they_refuse():
    one = parse_sentinel_url("redis+sentinel://app:p%40ss@h1:26380,h2/mymaster/3")
    assert one.sentinels == (("h1", 26380), ("h2", 26379)) and one.service == "mymaster" and one.db == 3
    assert (one.username, one.password, one.tls) == ("app", "p@ss", False)
    # redis-py's own names: Sentinel(...).master_for(service_name), the path naming the database.
    two = parse_sentinel_url("rediss+sentinel://h1:5000,[::1]:5001/0?service_name=cache")
    assert two.sentinels == (("h1", 5000), ("::1", 5001)) and two.service == "cache" and two.tls and two.db == 0
    assert is_sentinel_url("REDIS+SENTINEL://h/m") and not is_sentinel_url("redis://h:6379/0")
    for bad in ("redis+sentinel://h1:26379", "redis+sentinel://h1:x/m", "redis+sentinel:///m",
                "redis+sentinel://h1/m/notadb"):
        with pytest.raises(RedisSettingsError):
            parse_sentinel_url(bad)
    # TLS files go with rediss+sentinel:// as with rediss://, and are refused with redis+sentinel://.
    with pytest.raises(RedisSettingsError, match="not a rediss"):
        client_options("redis+sentinel://h1/m", environ={"TWINFLOW_REDIS_CA": "/etc/hostname"})
    assert client_options("rediss+sentinel://h1/m", environ={"TWINFLOW_REDIS_CA": "/etc/hostname"}) == \
        {"ssl_ca_certs": "/etc/hostname"}


def test_a_store_on_sentinel_follows_the_promoted_replica(sentinel_group, flow_name, monkeypatch):
    monkeypatch.setenv("TF_TEST_SENTINEL_PW", PASSWORD)
    monkeypatch.setenv("TWINFLOW_REDIS_PASSWORD", "env:TF_TEST_SENTINEL_PW")
    url = sentinel_group.url
    assert PASSWORD not in url
    first = sentinel_group.primary()
    assert first == 0
    client = connect_redis(url, 10, socket_timeout_s=1.0, slot_key=FlowKeys(flow_name).uplink)
    assert client.connection_pool.get_master_address() == ("127.0.0.1", sentinel_group.servers[0].port)
    store = FlowStore(client, FlowKeys(flow_name), "node-a", call_deadline_s=20)
    assert store.config_problems() == []
    store.raise_epoch(1, deadline_s=5, replicas=1, replica_wait_ms=1000)  # WAIT works through Sentinel
    (position,) = store.publish([b'{"id": "a"}'])
    replica = redis.Redis(port=sentinel_group.servers[1].port, password=PASSWORD)
    wait_until(lambda: replica.xlen(store.keys.uplink) == 1, 10, what="the replica to have the entry")
    # The wrong password is refused (and said so), the right one from the environment works.
    with pytest.raises(redis.AuthenticationError):
        client_from_url(url.replace("redis+sentinel://", "redis+sentinel://:wrong@"), socket_timeout=1).ping()

    sentinel_group.kill(0)
    began = time.monotonic()
    msg = Message("a", None, position, b"{}")
    assert store.processed([msg], deadline_s=30) == [False]  # answered by the promoted replica
    took = time.monotonic() - began
    assert sentinel_group.primary() == 1, sentinel_group.logs()
    assert store.r.connection_pool.get_master_address() == ("127.0.0.1", sentinel_group.servers[1].port)
    assert store.current_epoch(deadline_s=5) == 1 and store.r.xlen(store.keys.uplink) == 1
    assert took < 30
    # Nothing to fail over to any more: a call gives up at its deadline instead of hanging.
    sentinel_group.kill(1)
    with pytest.raises(RedisUnavailable):
        store.processed([msg], deadline_s=1.0)
