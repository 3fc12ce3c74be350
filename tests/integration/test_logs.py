"""Operator events as they come out of real parts: each one a JSON line with its flow, peer and epoch.

A flow member driven by hand (as in test_node_parts, on the session's real
Redis) logs ``promoted``, ``rolled_back``, ``fenced`` and ``demoted``; a
store whose own redis-server is frozen and thawed logs ``redis_down`` and
``redis_back`` once each; a leadership whose real ZooKeeper session is
expired logs ``zk_session_lost`` and ``zk_reconnected``; and the ``twinflow``
command writes JSON lines to stderr with ``--log-format json``.
"""

import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from kazoo.client import KazooClient

from twinflow import logs
from twinflow.cluster.connect import connect_zookeeper
from twinflow.cluster.leadership import Leadership
from twinflow.testing.servers import free_port
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from tests.conftest import wait_until
from tests.integration.test_node_parts import FLOW, node

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "cluster.yaml")


@pytest.fixture
def json_log():
    """The process's log as ``twinflow --log-format json`` sets it up, into a buffer; returns
    ``lines(event)``, the parsed lines of that event. Root and library levels are put back after."""
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("", *logs.NOISY)}
    out = io.StringIO()
    handler = logs.configure(logging.INFO, "json", stream=out)

    def lines(event=None):
        parsed = [json.loads(line) for line in out.getvalue().splitlines()]
        return [p for p in parsed if event is None or p.get("event") == event]

    yield lines
    root.removeHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def order(r, up, i):
    return r.xadd(up, {"data": json.dumps({"id": f"o{i}", "type": "order", "order_id": i})}).decode()


def rows(r, up, after="-"):
    return [(eid.decode(), fields[b"data"], None) for eid, fields in r.xrange(up, min=after)]


def test_promotion_rollback_fencing_and_demotion_each_log_one_line(json_log, redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    a, b = node(graph, "a", redis_url, clock, tmp_path), node(graph, "b", redis_url, clock, tmp_path)
    try:
        up, r = a.keys.uplink, a.store.r
        for i in range(3):
            order(r, up, i)
        a.on_batch(0, rows(r, up))  # a worker's batch: baked, and handled as far as its last entry
        a.parts.leader.is_master = True
        a.on_promoted(1)  # its catch-up delivers the three the flow had not processed: a rollback

        [promoted] = json_log("promoted")
        assert (promoted["flow"], promoted["peer"], promoted["epoch"], promoted["rolled_back"]) == \
            (flow_name, "a", 1, 3)
        assert promoted["logger"] == "twinflow.peer" and promoted["level"] == "INFO"
        [rolled] = json_log("rolled_back")
        assert (rolled["flow"], rolled["peer"], rolled["epoch"], rolled["count"]) == (flow_name, "a", 1, 3)

        # b takes epoch 2 while a still believes it is master: a's next write is refused.
        b.parts.leader.is_master = True
        b.on_promoted(2)
        late = order(r, up, 3)
        a.on_batch(1, rows(r, up, late))
        [fenced] = json_log("fenced")
        assert (fenced["flow"], fenced["peer"], fenced["epoch"], fenced["newest"]) == (flow_name, "a", 1, 2)
        assert fenced["level"] == "ERROR" and a.parts.leader.steps_down == ["fenced"]
        a.on_demoted("fenced")  # what the election calls once the member stepped down
        [demoted] = json_log("demoted")
        assert (demoted["peer"], demoted["epoch"], demoted["reason"]) == ("a", 1, "fenced")
        assert [p["peer"] for p in json_log("promoted")] == ["a", "b"]  # b's too: one line per promotion
    finally:
        a.parts.peer.stop()
        b.parts.peer.stop()


def answers(port):
    try:
        return redis.Redis(port=port, socket_connect_timeout=0.2).ping()
    except redis.ConnectionError:
        return False


def test_a_redis_outage_logs_its_start_once_and_its_end_with_its_length(json_log, tmp_path, flow_name):
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    store = FlowStore(redis.Redis(port=port, socket_timeout=0.2, socket_connect_timeout=0.2),
                      FlowKeys(flow_name), "node-a")
    try:
        wait_until(lambda: answers(port), 10, what="redis-server")  # not the store: that would log an outage
        store.raise_epoch(5)
        os.kill(server.pid, signal.SIGSTOP)  # connected but silent: each call times out
        assert not any(store.ping() for _ in range(3))
        [down] = json_log("redis_down")  # three failed calls, one outage
        assert (down["flow"], down["peer"], down["epoch"], down["level"]) == (flow_name, "node-a", 5, "WARNING")
        assert json_log("redis_back") == []
        os.kill(server.pid, signal.SIGCONT)
        wait_until(store.ping, 10, what="Redis to answer again")
        [back] = json_log("redis_back")
        assert (back["flow"], back["peer"], back["epoch"]) == (flow_name, "node-a", 5)
        assert back["seconds"] >= 0.4  # at least the three 0.2 s time-outs minus the first's start
        assert store.health() == "ok"
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()


def test_a_lost_zookeeper_session_logs_the_loss_and_the_new_session(json_log, zk_hosts, flow_name):
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    me = Leadership(zk, flow_name, "n1", "127.0.0.1:4", lambda epoch: None, lambda reason: None)
    try:
        me.start()
        wait_until(lambda: me.is_master, 5, what="master")
        epoch = me.epoch
        # Closing a second client that shares the session expires it for the first.
        ghost = KazooClient(hosts=zk_hosts, client_id=zk.client_id, timeout=2.0)
        ghost.start(timeout=5)
        ghost.stop()
        ghost.close()
        wait_until(lambda: json_log("zk_reconnected"), 10, what="a new session")
        [lost] = json_log("zk_session_lost")
        assert (lost["flow"], lost["peer"], lost["epoch"], lost["master"]) == (flow_name, "n1", epoch, True)
        [back] = json_log("zk_reconnected")
        assert back["flow"] == flow_name and back["peer"] == "n1" and back["new_session"] is True
    finally:
        me.stop()
        zk.stop()


def test_the_command_writes_json_lines_to_stderr(tmp_path):
    port = free_port()  # nothing listens: the peer waits for Redis, says so, then gives up with exit code 3
    r = subprocess.run([sys.executable, "-m", "twinflow.cli", "--log-format", "json", "run", EXAMPLE,
                        "--peer-id", "a", "--redis", f"redis://127.0.0.1:{port}/0", "--zk", "127.0.0.1:1",
                        "--connect-timeout", "1", "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    # Every line is a log record in JSON, but the command's own last word (printed, not logged).
    lines = [line for line in r.stderr.splitlines() if not line.startswith("twinflow: ")]
    records = [json.loads(line) for line in lines]
    waits = [p for p in records if p.get("event") == "service_waiting"]
    assert waits and all(p["level"] == "WARNING" and p["msg"].startswith("waiting for Redis") for p in waits)
    assert waits[0]["where"] == f"redis://127.0.0.1:{port}/0"
    assert any(line.startswith("twinflow: Redis at") for line in r.stderr.splitlines())
