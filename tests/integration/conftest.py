"""Fixtures of the integration tests that start servers of their own."""

import os
import signal
import subprocess

import pytest
import redis

from tests.conftest import wait_until
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.testing.servers import free_port, redis_answers


@pytest.fixture
def own_redis(tmp_path):
    """Start a redis-server of our own with extra arguments; every one is killed after the test."""
    started = []

    def start(*args):
        port = free_port()
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--dir", str(tmp_path), "--dbfilename", f"{port}.rdb", *args],
                                stdout=subprocess.DEVNULL)
        started.append(proc)
        wait_until(lambda: redis_answers(port), 10, what="redis-server")
        return port, proc

    yield start
    for proc in started:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


@pytest.fixture
def primary_and_replica(own_redis):
    """A redis-server primary and one replica of it, in sync: (primary port, replica port,
    replica process)."""
    port, _ = own_redis()
    rport, replica = own_redis("--replicaof", "127.0.0.1", str(port))
    primary, on_replica = redis.Redis(port=port), redis.Redis(port=rport)
    wait_until(lambda: primary.info("replication")["connected_slaves"] == 1
               and on_replica.info("replication")["master_link_status"] == "up", 20, what="the replica to sync")
    return port, rport, replica


@pytest.fixture
def store(redis_url, flow_name):
    """A flow's store on the session's Redis, as peer-a at epoch 1 (the audit's tests)."""
    s = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "peer-a", id_ttl=600)
    s.raise_epoch(1)
    yield s
    s.close()
