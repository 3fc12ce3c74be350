"""Each peer's Prometheus endpoint (cluster/metrics.py), scraped over HTTP like Prometheus would.

Two real peers without Spark: their stores on the session's Redis, their
leadership on the session's ZooKeeper, their gRPC servers (escalation) on
loopback; the test hands both the same uplink batch, as their Spark queries
would. The scrape must show what happened: the master delivered, escalated
and fired a time-out late; the worker baked, took the escalation and
released its claims. ``tests/cluster/test_failover.py`` scrapes real
``twinflow run`` processes.
"""

import json
import re
import socket
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.integration.test_escalation_admission import NoSpark
from twinflow.cluster.peer import Peer
from twinflow.cluster.peer_config import PeerConfig
from twinflow.cluster.on_cluster import StartRefused
from twinflow.runtime.clock import FakeClock
from twinflow.runtime.flowgraph import parse_graph

FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
message: {{id: id}}
input: match
nodes:
  match: {{type: join, types: [order, payment], activation_field: order_id, timeout: 5, links: {{joined: deliver}}}}
  deliver: {{type: action, sink: {{stream: sink}}}}
  claims: {{type: sort, pairs_with: deliver, key: order_id, bake_time: 600}}
cluster: {{redis_checks: warn}}
"""


def scrape(address: str) -> list[tuple[str, dict, float]]:
    """Every sample the endpoint serves now: (sample name, labels, value)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def value(samples, name: str, **labels) -> float:
    """The one sample ``name`` whose labels include ``labels``."""
    found = [v for n, ls, v in samples if n == name and all(ls.get(k) == str(w) for k, w in labels.items())]
    assert len(found) == 1, f"{name} {labels}: {len(found)} samples"
    return found[0]


def metric(address: str, name: str, **labels) -> float:
    return value(scrape(address), name, **labels)


@pytest.fixture
def pair(redis_url, zk_hosts, flow_name, tmp_path):
    """Peers a (master) and b (worker) of a claim-pair flow, each serving metrics on a free port."""
    with started_pair(redis_url, zk_hosts, flow_name, tmp_path) as peers:
        yield peers


@contextmanager
def started_pair(redis_url: str, zk_hosts: str, flow_name: str, state_dir: Path):
    """Starts the two peers of :func:`pair`: (peer a, peer b, their clock); stops them after."""
    graph = parse_graph(FLOW.format(name=flow_name))
    clock = FakeClock(1000.0)
    members, peers = {}, []
    try:
        for peer_id in ("a", "b"):
            cfg = PeerConfig(peer_id=peer_id, redis_url=redis_url, zk_hosts=zk_hosts,
                             state_dir=str(state_dir / peer_id), metrics_listen="127.0.0.1:0")
            peer = Peer.for_flow(graph, cfg, clock=clock, parts=NoSpark())
            peers.append(peer)
            peer.start()
            members[peer_id] = n = peer.member
            # As the warm-up batch would: only then does the member queue for the election,
            # so a, warm first, is the master.
            n.warmed()
            if peer_id == "a":
                wait_until(lambda: n.role == "master", 10.0, what="a to be master")
        # The master escalates to the peers it knew when a step committed: wait until b is one.
        wait_until(lambda: members["a"].sender.stats()["targets"].get("b", {}).get("connected"), 10.0,
                   what="a's escalation stream to b")
        yield (*peers, clock)
    finally:
        for peer in peers:
            peer.stop()


def test_a_scrape_shows_what_each_node_did(pair, flow_name):
    peer_a, peer_b, clock = pair
    a, b = peer_a.member, peer_b.member
    A, B = peer_a.metrics.address, peer_b.metrics.address
    who_a, who_b = {"flow": flow_name, "peer": "a"}, {"flow": flow_name, "peer": "b"}

    before = scrape(A)
    assert value(before, "twinflow_is_master", **who_a) == 1
    assert value(before, "twinflow_role", role="master", **who_a) == 1
    assert value(before, "twinflow_role", role="worker", **who_a) == 0
    assert value(before, "twinflow_epoch", **who_a) == a.epoch >= 1
    assert value(before, "twinflow_uplink_read_total", **who_a) == 0
    assert value(before, "twinflow_messages_total", outcome="delivered", **who_a) == 0
    assert value(before, "twinflow_redis_up", **who_a) == 1
    assert value(before, "twinflow_zookeeper_connected", **who_a) == 1
    assert value(before, "twinflow_zookeeper_disconnects_total", **who_a) == 0
    assert value(before, "twinflow_fenced_total", **who_a) == 0
    assert metric(B, "twinflow_is_master", **who_b) == 0
    assert metric(B, "twinflow_role", role="worker", **who_b) == 1

    # o1 and p1 join and are delivered; o2 waits for its payment until the 5 s time-out.
    docs = [{"id": "o1", "type": "order", "order_id": 1}, {"id": "p1", "type": "payment", "order_id": 1},
            {"id": "o2", "type": "order", "order_id": 2}]
    bodies = [json.dumps(d).encode() for d in docs]
    rows = [(p, body, None) for p, body in zip(a.store.publish(bodies), bodies)]
    b.on_batch(0, rows)  # the worker bakes first, so the escalation finds every message baked
    assert metric(B, "twinflow_baked", **who_b) == 3
    assert metric(B, "twinflow_rule_pending", ruleset="all", **who_b) == 3  # RULE_PEND, per ruleset
    a.on_batch(0, rows)  # a master's batch runs ahead of on_batch, as in a real peer: wait for it
    wait_until(lambda: metric(A, "twinflow_batch_duration_seconds_count", role="master", **who_a) == 1,
               10.0, what="a's batch to finish")

    got = scrape(A)
    assert value(got, "twinflow_uplink_read_total", **who_a) == 3
    assert value(got, "twinflow_messages_total", outcome="delivered", **who_a) == 3
    assert value(got, "twinflow_messages_total", outcome="skipped", **who_a) == 0
    assert value(got, "twinflow_outlink_messages_total", outlink="deliver.done", **who_a) == 1
    assert value(got, "twinflow_outlink_messages_total", outlink="match.expired", **who_a) == 0
    assert value(got, "twinflow_pending", **who_a) == 1  # o2's open group
    assert value(got, "twinflow_batch_duration_seconds_count", role="master", **who_a) == 1
    assert value(got, "twinflow_batch_duration_seconds_sum", role="master", **who_a) > 0
    # No Spark reader records how far the peers read: every entry counts as not read yet.
    assert value(got, "twinflow_uplink_lag", **who_a) == 3
    # In uplink time: from the oldest entry (none read yet) to the newest, by their IDs' milliseconds.
    first, newest = (int(rows[i][0].split("-")[0]) for i in (0, -1))
    assert value(got, "twinflow_uplink_lag_seconds", **who_a) == pytest.approx((newest - first) / 1000)

    # The master's escalation reaches b (a real gRPC stream): acked there, its claims released.
    wait_until(lambda: metric(A, "twinflow_escalation_claims_total", target="b", result="acked", **who_a) == 3,
               10.0, what="b to ack the 3 claims")
    got = scrape(A)
    assert value(got, "twinflow_escalation_batches_total", target="b", result="sent", **who_a) >= 1
    assert value(got, "twinflow_escalation_batches_total", target="b", result="acked", **who_a) >= 1
    assert value(got, "twinflow_escalation_batches_total", target="b", result="refused", **who_a) == 0
    assert value(got, "twinflow_escalation_pending_claims", target="b", **who_a) == 0
    worker = scrape(B)
    assert value(worker, "twinflow_uplink_read_total", **who_b) == 3
    assert value(worker, "twinflow_messages_total", outcome="claimed", **who_b) == 3
    assert value(worker, "twinflow_baked", **who_b) == 0
    assert value(worker, "twinflow_rule_pending", ruleset="all", **who_b) == 0
    assert value(worker, "twinflow_escalation_batches_received_total", result="accepted", **who_b) >= 1
    assert value(worker, "twinflow_escalation_batches_received_total", result="refused", **who_b) == 0
    assert value(worker, "twinflow_batch_duration_seconds_count", role="worker", **who_b) == 1
    assert value(worker, "twinflow_epoch", **who_b) == a.epoch  # the newest it has seen: the master's

    # o2's time-out is due at 1005; the timer thread sees it at 1006, one second late.
    assert metric(A, "twinflow_timer_lateness_seconds_count", **who_a) == 0
    clock.advance(6.0)
    a.wake.set()
    wait_until(lambda: metric(A, "twinflow_outlink_messages_total", outlink="match.expired", **who_a) == 1,
               10.0, what="o2's time-out to fire")
    got = scrape(A)
    assert value(got, "twinflow_timer_lateness_seconds_count", **who_a) == 1
    assert value(got, "twinflow_timer_lateness_seconds_sum", **who_a) == pytest.approx(1.0)
    assert value(got, "twinflow_timer_lateness_seconds_bucket", le="0.5", **who_a) == 0
    assert value(got, "twinflow_timer_lateness_seconds_bucket", le="1.0", **who_a) == 1
    assert value(got, "twinflow_pending", **who_a) == 0

    # A newer epoch in Redis (another master took over): a's next write is refused and it steps down.
    a.store.raise_epoch(a.epoch + 5)
    late = json.dumps({"id": "o3", "type": "order", "order_id": 3}).encode()
    a.on_batch(1, [(a.store.publish([late])[0], late, None)])
    wait_until(lambda: metric(A, "twinflow_fenced_total", **who_a) == 1, 10.0, what="a to be fenced")
    got = scrape(A)
    assert value(got, "twinflow_uplink_read_total", **who_a) == 4


def test_the_metrics_page_lists_every_metric_served(pair):
    peer_a, peer_b, _ = pair
    page = (Path(__file__).parents[2] / "docs" / "reference" / "metrics.md").read_text()
    listed = set(re.findall(r"^\| `(twinflow_[a-z_]+)` \|", page, re.M))
    served = {re.sub(r"_(count|sum|bucket)$", "", n)
              for peer in (peer_a, peer_b) for n, _, _ in scrape(peer.metrics.address)}
    assert served - listed == set()
    assert len(served) >= 20  # the scrape held the peer's metrics, not just an empty page


def test_the_endpoint_stops_with_the_node(pair):
    peer_a, _, _ = pair
    address = peer_a.metrics.address
    assert scrape(address)
    peer_a.stop()
    with pytest.raises(urllib.error.URLError):
        scrape(address)


def test_a_metrics_address_that_cannot_be_bound_refuses_the_start(redis_url, flow_name, tmp_path):
    graph = parse_graph(FLOW.format(name=flow_name))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for listen, why in ((f"127.0.0.1:{port}", "in use"), ("127.0.0.1:http", "not HOST:PORT")):
            cfg = PeerConfig(peer_id="a", redis_url=redis_url, zk_hosts="unused", state_dir=str(tmp_path),
                             metrics_listen=listen)
            peer = Peer.for_flow(graph, cfg, parts=NoSpark())
            with pytest.raises(StartRefused, match=f"cannot serve metrics on {listen}: .*{why}"):
                peer.start()
            assert peer.member.store is None and peer.zk is None  # refused before it connected to anything
            peer.stop()
