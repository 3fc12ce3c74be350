"""With ``cluster.wait_replicas`` set, the fencing epoch raised at a promotion is confirmed by
``WAIT`` like every COMMIT, and a promotion whose epoch no replica confirmed is not taken: an
epoch on the primary alone could go back in a Redis failover between the promotion and the new
master's first COMMIT, and under the old epoch the old master's COMMITs would pass.

Real servers: a redis-server primary with one replica on 127.0.0.1 (the replica is stopped with
SIGSTOP so that WAIT cannot be satisfied, and continued with SIGCONT), the session's ZooKeeper,
a ``twinflow run`` process; everything stopped by PID.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from tests.cluster.harness import cluster_on
from tests.conftest import wait_until
from twinflow.testing.redis_ha import LocalSentinel
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.store_errors import RedisUnavailable

pytestmark = pytest.mark.cluster

FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
message: {{id: id}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
cluster: {{session_timeout: 2.0, wait_replicas: 1, replica_wait_ms: 200}}
"""


@pytest.fixture
def primary_and_replica(tmp_path):
    group = LocalSentinel.start(str(tmp_path / "redis"), replicas=1, sentinels=0)
    yield group
    for s in group.servers:
        try:
            os.kill(s.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    group.stop()


def test_raise_epoch_waits_for_the_replicas_and_gives_up_without_them(primary_and_replica, flow_name):
    primary, replica = primary_and_replica.servers
    store = FlowStore(redis.Redis(port=primary.port, socket_timeout=2), FlowKeys(flow_name), "node-a")
    assert store.raise_epoch(1, deadline_s=2, replicas=1, replica_wait_ms=200) == 1
    assert redis.Redis(port=replica.port).get(store.keys.epoch) == b"1"  # WAIT said so: it is there

    os.kill(replica.pid, signal.SIGSTOP)  # no replica acknowledges any more
    began = time.monotonic()
    with pytest.raises(RedisUnavailable, match="replicas"):
        store.raise_epoch(2, deadline_s=1.0, replicas=1, replica_wait_ms=200)
    assert time.monotonic() - began < 5.0
    # The gRPC ingest's publish too: not acknowledged while no replica has the entries.
    with pytest.raises(RedisUnavailable, match="replicas"):
        store.publish([b'{"id": "x"}'], deadline_s=0.5, replicas=1, replica_wait_ms=200)
    os.kill(replica.pid, signal.SIGCONT)
    assert store.raise_epoch(3, deadline_s=5, replicas=1, replica_wait_ms=200) == 3
    (position,) = store.publish([b'{"id": "y"}'], deadline_s=5, replicas=1, replica_wait_ms=200)
    assert redis.Redis(port=replica.port).xrange(store.keys.uplink, position, position)
    assert redis.Redis(port=replica.port).get(store.keys.epoch) == b"3"


def test_a_promotion_whose_epoch_no_replica_confirmed_is_not_taken(primary_and_replica, services, flow_name,
                                                                    tmp_path):
    primary, replica = primary_and_replica.servers
    on_primary = type("Svc", (), {"redis_url": f"redis://127.0.0.1:{primary.port}/0",
                                  "zk_hosts": services.zk_hosts})()
    cluster = cluster_on(on_primary, tmp_path, flow_name, text=FLOW.format(name=flow_name))
    try:
        os.kill(replica.pid, signal.SIGSTOP)
        peer = cluster.peer("a")
        log = tmp_path / "a.log"
        # The peer streams and is elected, but each promotion fails: its epoch was not confirmed.
        wait_until(lambda: log.read_text(errors="replace").count("promotion failed") >= 2, 90,
                   what="two refused promotions")
        assert cluster.status("a").get("role") != "master", cluster.logs()
        assert "replicas" in log.read_text(errors="replace")
        assert peer.alive()
        os.kill(replica.pid, signal.SIGCONT)
        cluster.wait_status("a", role="master", timeout_s=30)
        # And the epoch the master holds is on the replica.
        epoch = int(cluster.status("a")["epoch"])
        assert int(redis.Redis(port=replica.port).get(cluster.key("epoch"))) == epoch
    finally:
        cluster.stop()
