"""A peer joins a flow only with a flow file and a twinflow that can carry on its state in Redis:
the checks of ``cluster/flow_shape.py`` against a real redis-server."""

from __future__ import annotations

import pytest
import redis

from twinflow.cluster.flow_shape import STATE_FORMAT, check_shape
from twinflow.cluster.on_cluster import StartRefused
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore

FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
input: match
nodes:
  match:
    type: join
    join_type: and
    types: [order, payment]
    type_field: type
    activation_field: order_id
    timeout: {timeout}
    links: {{joined: deliver}}
  deliver: {{type: action, sink: {{stream: sink}}}}
"""
WITHOUT_JOIN = """\
flow: {name}
uplink: {{stream: uplink}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
"""


@pytest.fixture
def shaped(redis_url, flow_name):
    store = FlowStore(redis.Redis.from_url(redis_url), FlowKeys(flow_name), "peer-a")
    yield store, lambda text, **kw: parse_graph(text.format(name=flow_name, **{"timeout": 10, **kw}), "flow.yaml")
    store.close()


def test_a_first_start_records_the_format_and_the_nodes(shaped):
    store, graph = shaped
    check_shape(graph(FLOW), store)
    recorded = store.r.hgetall(store.keys.shape)
    assert int(recorded[b"format"]) == STATE_FORMAT
    assert recorded[b"nodes"] == b'{"deliver": "action", "match": "join"}'


def test_a_changed_time_out_or_a_dropped_node_that_holds_nothing_is_taken(shaped):
    store, graph = shaped
    check_shape(graph(FLOW), store)
    check_shape(graph(FLOW, timeout=30), store)  # takes effect as the peers restart with it
    check_shape(graph(WITHOUT_JOIN), store)      # the join holds nothing: nothing is orphaned
    assert b'"match"' not in store.r.hget(store.keys.shape, "nodes")


def test_dropping_a_node_that_holds_state_is_refused_naming_it_and_what_it_holds(shaped):
    store, graph = shaped
    check_shape(graph(FLOW), store)
    store.r.hset(store.keys.state("match"), mapping={"7": "{}", "8": "{}"})  # two open groups
    with pytest.raises(StartRefused, match=r"flow.yaml: this flow file drops node 'match', but Redis holds 2 state "
                                           r"entries of it .*Keep the node until it holds nothing"):
        check_shape(graph(WITHOUT_JOIN), store)
    assert b'"match"' in store.r.hget(store.keys.shape, "nodes")  # nothing recorded: refused whole


def test_changing_a_nodes_kind_while_it_holds_state_is_refused(shaped):
    store, graph = shaped
    check_shape(graph(FLOW), store)
    store.r.hset(store.keys.state("match"), "7", "{}")
    changed = FLOW.replace("    type: join\n    join_type: and\n    types: [order, payment]\n    type_field: type\n"
                           "    activation_field: order_id\n    timeout: {timeout}\n    links: {{joined: deliver}}\n",
                           "    type: action\n    links: {{done: deliver}}\n")
    with pytest.raises(StartRefused, match=r"changes node 'match' from join to action, but Redis holds 1 state"):
        check_shape(graph(changed), store)


def test_state_of_a_node_no_shape_recorded_is_found_too(shaped):
    store, graph = shaped
    store.r.hset(store.keys.state("match"), "7", "{}")  # a flow run before shapes were recorded
    with pytest.raises(StartRefused, match="drops node 'match'"):
        check_shape(graph(WITHOUT_JOIN), store)


def test_a_state_format_newer_than_this_twinflow_reads_is_refused(shaped):
    store, graph = shaped
    store.r.hset(store.keys.shape, "format", STATE_FORMAT + 1)
    with pytest.raises(StartRefused, match=rf"written by a newer twinflow \(state format {STATE_FORMAT + 1}\); this "
                                           rf"peer reads up to format {STATE_FORMAT}"):
        check_shape(graph(FLOW), store)


def test_twinflow_run_refuses_such_a_start_with_exit_4_before_anything_starts(shaped, tmp_path, redis_url):
    import subprocess
    import sys

    store, graph = shaped
    store.r.hset(store.keys.shape, "format", STATE_FORMAT + 1)
    flow = tmp_path / "flow.yaml"
    flow.write_text(FLOW.format(name=store.keys.flow, timeout=10))
    r = subprocess.run([sys.executable, "-m", "twinflow.cli", "run", str(flow), "--peer-id", "a", "--redis", redis_url,
                        "--zk", "127.0.0.1:1", "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 4, r.stderr[-2000:]
    assert "written by a newer twinflow" in r.stderr and "Traceback" not in r.stderr
