"""Bad input on the cluster: each kind reaches the right outlink with its reason, once, and the
flow keeps running; random bytes and random field sets leave every uplink entry accounted for.

One ``twinflow run`` process (a lone master) runs examples/cluster-every-node.yaml
against the session's real redis-server and ZooKeeper.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cluster.every_node import graph, stream_suffix, unlinked
from tests.cluster.harness import cluster_on
from tests.conftest import wait_until
from twinflow.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, services):
    c = cluster_on(services, tmp_path_factory.mktemp("bad-input"), "t" + uuid.uuid4().hex[:10],
             text=open(graph().source).read())
    c.peer("a")
    c.wait_status("a", role="master")
    yield c
    c.stop()


def outputs(cluster: LocalCluster) -> dict[tuple[str, str], list[dict]]:
    g = graph()
    return {(n, o): [f for _, f in cluster.stream(stream_suffix(g, n, o))] for n, o in unlinked(g)}


def seen_ids(cluster: LocalCluster) -> Counter:
    """How often each message ID is out of the flow or held in a node's state."""
    count: Counter = Counter()
    for entries in outputs(cluster).values():
        for f in entries:
            count.update(f["id"].split("+"))
    for node in graph().nodes:
        for value in cluster.redis.hvals(cluster.key(f"state:{node}")):
            count.update(re.findall(r'\["((?:[^"\\]|\\.)*)",\{', value.decode()))  # held messages: [id, doc]
    return count


def failures_by_position(cluster: LocalCluster) -> dict[str, str]:
    return {f["position"]: f["reason"] for _, f in cluster.stream("failure")}


def doc(fields: dict) -> bytes:
    """A body the uplink reader accepts (it has the ID and the claim pair's key); the nodes judge the rest."""
    return json.dumps({**fields, "seq": 1}).encode()


def test_each_kind_of_bad_input_reaches_its_outlink_with_its_reason_once(cluster):
    cases = [  # (body, where it must leave, words of the reason)
        (b"\xff\xfe{", ("failure", None), "not JSON"),
        (b'{"id": "x1", "type": "order", "order_id": ', ("failure", None), "not JSON"),
        (b'{"type": "order"}', ("failure", None), "no ID field 'id'"),
        (b'{"id": "big", "pad": "' + b"x" * (1 << 20) + b'"}', ("failure", None), "over the limit"),
        (b'{"id": "no-key", "type": "order"}', ("failure", None), "no key field 'seq'"),  # the claim pair's key
        (b'{"id": "bad-key", "type": "order", "seq": "soon"}', ("failure", None), "is not an int"),
        (doc({"id": "no-type", "n": 1}), ("route_orders", "failure"), "no field 'type'"),
        (doc({"id": "long", "uuid": "u" * 97, "type": "order"}), ("guard", "in_doubt"), "longer than 96"),
        (doc({"id": "no-order-id", "type": "order"}), ("match", "failure"), "no field 'order_id'"),
        (doc({"id": "odd-type", "type": "teleport"}), ("readings", "failure"), "no field 'n'"),
        (doc({"id": "bad-seq", "type": "step", "grp": "g", "n": 1.5}), ("reorder", "failure"), "must be an integer"),
    ]
    positions = [cluster.publish_raw(body) for body, _, _ in cases]
    cluster.publish([{"id": "good", "type": "reading", "n": 1, "seq": 1}])  # the flow keeps running after all that
    wait_until(lambda: seen_ids(cluster)["good"] == 1, 60, what="the good message after the bad ones")
    failures = failures_by_position(cluster)
    out = outputs(cluster)
    for position, (body, (node, outlink), reason) in zip(positions, cases):
        if node == "failure":
            assert reason in failures.get(position, ""), (body[:60], failures.get(position))
        else:
            mid = json.loads(body)["id"]
            hits = [f for f in out[(node, outlink)] if f["id"] == mid]
            assert len(hits) == 1, (mid, node, outlink)
            assert reason in json.loads(hits[0]["info"])["reason"]
    assert len(failures) == len(set(failures))


field_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8),
                         st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                  max_size=2))
documents = st.fixed_dictionaries({}, optional={
    "type": st.one_of(st.sampled_from(["order", "payment", "IMF", "MDN", "DSN", "step", "alert", "reading"]),
                      field_values),
    "order_id": field_values, "recipients": st.one_of(st.just("a@x"), field_values),
    "parent_id": field_values, "final_recipient": field_values, "grp": field_values,
    "n": field_values, "host": field_values, "uuid": field_values,
})
entries = st.lists(st.one_of(st.binary(max_size=40).map(lambda b: ("bytes", b)),
                             documents.map(lambda d: ("doc", d))), min_size=1, max_size=25)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(entries)
def test_random_bytes_and_field_sets_leave_every_entry_accounted_for(cluster, items):
    good, positions = [], []
    for kind, value in items:
        if kind == "bytes":
            positions.append(cluster.publish_raw(value))
        else:
            fields = {**value, "id": "h" + uuid.uuid4().hex[:12], "seq": len(positions)}
            positions.append(cluster.publish_raw(json.dumps(fields).encode()))
            good.append(fields["id"])

    def accounted():
        seen, failures = seen_ids(cluster), failures_by_position(cluster)
        done = [p for p, (kind, _) in zip(positions, items) if kind == "bytes" and p in failures]
        return all(seen[i] >= 1 for i in good) and len(done) == sum(k == "bytes" for k, _ in items)

    wait_until(accounted, 60, interval_s=0.2, what="every entry on an outlink, held, or on the failure stream")
    seen = seen_ids(cluster)
    assert [i for i in good if seen[i] != 1] == []  # once, not twice
