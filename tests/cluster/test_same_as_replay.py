"""Same results as replay: a live two-peer cluster, its master killed half-way, sends out of
every outlink exactly what ``twinflow replay`` sends for the same events.

The flow (examples/cluster-every-node.yaml) has every node kind, chained
behind a history node: AND, OR and XOR joins, aggregate, resequence,
sequence, sort and action, with the claim pair on the worker. The master is
SIGKILLed while join groups, aggregations and resequence groups are half
complete and their time-outs pending; the new master completes them and
fires the time-outs.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.cluster.every_node import events, graph, replay_outputs, stream_suffix, unlinked
from tests.conftest import wait_until
from twinflow.runtime.positions import position_order
from twinflow.testing.local_cluster import LocalCluster
pytestmark = pytest.mark.cluster


def cluster_outputs(cluster: LocalCluster) -> dict[tuple[str, str], list[tuple[float, dict]]]:
    g = graph()
    out = {}
    for node, outlink in unlinked(g):
        entries = cluster.stream(stream_suffix(g, node, outlink))
        if entries:
            out[(node, outlink)] = entries
    return out


@pytest.mark.flow(text=open(graph().source).read())
def test_a_cluster_with_a_master_kill_sends_out_what_replay_does(cluster):
    docs = events()
    want = replay_outputs(docs)
    total = sum(len(v) for v in want.values())

    cluster.peer("a")
    cluster.wait_status("a", role="master")
    cluster.peer("b")
    cluster.wait_status("b", role="worker", streaming=1)

    half = len(docs) // 2
    positions = cluster.publish(docs[:half])
    mark = cluster.key("processed")
    wait_until(lambda: (m := cluster.redis.get(mark)) and position_order(m.decode()) >= position_order(positions[-1]),
               30, what="the master to process the first half")
    pending = {node: cluster.redis.hlen(cluster.key(f"state:{node}")) for node in ("match", "monitor", "reorder")}
    assert all(pending.values()), f"the kill must find pending state in every holding node: {pending}"

    os.killpg(cluster.peers["a"].pid, signal.SIGKILL)
    cluster.wait_status("b", role="master", timeout_s=30)
    cluster.publish(docs[half:])

    def done():
        return sum(len(v) for v in cluster_outputs(cluster).values()) >= total
    try:
        wait_until(done, 60, interval_s=0.5, what=f"{total} outputs")
    except AssertionError:
        print({k: len(v) for k, v in cluster_outputs(cluster).items()}, cluster.logs())
        raise
    got = cluster_outputs(cluster)

    assert {k: [f["id"] for _, f in v] for k, v in got.items()} == want
    # Every output was written within 1 s of the time the flow decided it: a message's batch
    # time, or a time-out's due time (so the old master's time-outs fired on time on the new one).
    late = [(k, f["id"], written - float(f["at"])) for k, v in got.items() for written, f in v
            if not -0.05 <= written - float(f["at"]) <= 1.0]
    assert not late, late
    timers = [written - float(f["at"]) for k, v in got.items() if k[1] in ("expired", "timeout", "orphan")
              for written, f in v]
    print(f"time-outs fired {min(timers):.3f}..{max(timers):.3f} s after their due time")
    assert all(cluster.redis.hlen(cluster.key(f"state:{node}")) == 0 for node in ("match", "monitor", "reorder"))
