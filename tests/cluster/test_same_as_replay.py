"""Same results as replay: a live two-node cluster, its master killed half-way, sends out of
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
from tests.cluster.harness import Flow
from tests.conftest import wait_until
from twinflow.runtime.positions import position_order
pytestmark = pytest.mark.cluster


@pytest.fixture
def flow(tmp_path, services, flow_name):
    f = Flow(tmp_path, flow_name, services, text=open(graph().source).read())
    yield f
    f.stop_all()


def cluster_outputs(flow: Flow) -> dict[tuple[str, str], list[tuple[float, dict]]]:
    g = graph()
    out = {}
    for node, outlink in unlinked(g):
        entries = flow.stream(stream_suffix(g, node, outlink))
        if entries:
            out[(node, outlink)] = entries
    return out


def test_a_cluster_with_a_master_kill_sends_out_what_replay_does(flow):
    docs = events()
    want = replay_outputs(docs)
    total = sum(len(v) for v in want.values())

    flow.node("a")
    flow.wait_status("a", role="master")
    flow.node("b")
    flow.wait_status("b", role="worker", streaming=1)

    half = len(docs) // 2
    positions = flow.publish_docs(docs[:half])
    mark = flow.key("processed")
    wait_until(lambda: (m := flow.r.get(mark)) and position_order(m.decode()) >= position_order(positions[-1]),
               30, what="the master to process the first half")
    pending = {node: flow.r.hlen(flow.key(f"state:{node}")) for node in ("match", "monitor", "reorder")}
    assert all(pending.values()), f"the kill must find pending state in every holding node: {pending}"

    os.killpg(flow.nodes["a"].pid, signal.SIGKILL)
    flow.wait_status("b", role="master", timeout_s=30)
    flow.publish_docs(docs[half:])

    def done():
        return sum(len(v) for v in cluster_outputs(flow).values()) >= total
    try:
        wait_until(done, 60, interval_s=0.5, what=f"{total} outputs")
    except AssertionError:
        print({k: len(v) for k, v in cluster_outputs(flow).items()}, flow.logs())
        raise
    got = cluster_outputs(flow)

    assert {k: [f["id"] for _, f in v] for k, v in got.items()} == want
    # Every output was written within 1 s of the time the flow decided it: a message's batch
    # time, or a time-out's due time (so the old master's time-outs fired on time on the new one).
    late = [(k, f["id"], written - float(f["at"])) for k, v in got.items() for written, f in v
            if not -0.05 <= written - float(f["at"]) <= 1.0]
    assert not late, late
    timers = [written - float(f["at"]) for k, v in got.items() if k[1] in ("expired", "timeout", "orphan")
              for written, f in v]
    print(f"time-outs fired {min(timers):.3f}..{max(timers):.3f} s after their due time")
    assert all(flow.r.hlen(flow.key(f"state:{node}")) == 0 for node in ("match", "monitor", "reorder"))
