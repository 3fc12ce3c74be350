"""What a promotion's state read costs as the history grows: Redis, decoding, the node's load.

A new master reads every node's state hash whole (``FlowStore.load_state_version``) and
gives each node its entries (``load_state``) before it delivers anything; the history
node's hash holds every identifier seen within its retention, so this is on the
failover's recovery time and grows with the flow's rate (a flow at 500 msg/s with a
one-hour retention holds 1.8 M identifiers).

For each size N the chained flow's history (``guard``) is written as a real history node
makes it (N New messages, their state entries written as a step's COMMIT writes them)
into a real redis-server on loopback; then, alternating, median of 5 each:

- ``before``: the code before 2026-11-27 (copied here): every entry decoded with the
  standard library's ``json.loads``, the node's load one Python step per entry, the
  cyclic garbage collector on;
- ``now``: what a promotion runs, ``MasterFlow.load`` of the chained flow (orjson
  first, the node's load in C-level map/zip/sort, the collector paused);

and the HGETALL alone (what no change in Python can remove); then ``warm``: what a
promotion runs since the worker's warm copy (``cluster/warm_state.py``), the copy primed
as a worker's round does (not timed), one step of ``TAIL`` new messages committed after
it (the steps since the worker's last round), and ``WarmState.take`` timed: the tail
read and applied, the flow's other nodes read whole.

Run: ``.venv/bin/python bench/state_load.py [N ...]`` (default 10000 50000 200000); prints
one JSON line per size and appends them to ``bench/results/state_load.jsonl``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))
from common import save  # noqa: E402

from twinflow.cluster.master_flow import MasterFlow
from twinflow.cluster.warm_state import WarmState
from twinflow.runtime.message import Message
from twinflow.runtime import json_text
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.history import HistoryNode, _entry
from twinflow.runtime.store import flow_store
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.testing.servers import kill_pid, start_answering, start_redis

CHAINED = Path(__file__).parents[1] / "examples" / "cluster-chained.yaml"
NODE = "guard"
FILLED_FROM = 1_764_000_000.0  # the first filled entry's time (500 per second after it)


def load_before(store: FlowStore) -> None:
    """The promotion's history load as the code did it before 2026-11-27."""
    flow_store.loads = json.loads
    try:
        entries, _, _ = store.load_state_version([NODE])
    finally:
        flow_store.loads = json_text.loads
    node = HistoryNode(NODE, retention=3600.0)
    for key, (time_, processing, completed) in sorted(entries[NODE].items(), key=lambda kv: kv[1][0]):
        trigger, uuid = json.loads(key)
        node.store._entries[(trigger, uuid)] = _entry((time_, processing, completed))
        node.store._order.append((time_, (trigger, uuid)))


def fill(r: redis.Redis, keys: FlowKeys, n: int) -> None:
    node = HistoryNode(NODE, retention=3600.0)
    for i in range(n):
        node.on_message(Msg(f"m{i}", {"uuid": f"order-{i:08d}"}), now=FILLED_FROM + i / 500)
    entries = node.changed_state()
    pipe = r.pipeline(transaction=False)
    for i, (field, value) in enumerate(entries.items()):
        pipe.hset(keys.state(NODE), field, json_text.compact(value))
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


TAIL = 200  # messages committed since the worker's last round (0.1 s at 2,000 msg/s)
_positions = iter(range(1, 1 << 40))


def commit_tail(graph, store: FlowStore, n: int) -> None:
    """One master step of ``n`` new orders, committed (its history entries and its log entry)."""
    flow = MasterFlow.load(graph, store)
    msgs = []
    for _ in range(n):
        k = next(_positions)
        doc = {"id": f"t{k}", "uuid": f"tail-{k}", "type": "order", "order_id": k, "seq": k}
        msgs.append(Message(doc["id"], None, f"{k}-0", b"{}", doc))
    # At a time within the retention of every filled entry: the step clears none of them.
    store.commit(1, flow.run(msgs, now=FILLED_FROM + 500.0, epoch=1))


def warm_take_ms(graph, store: FlowStore) -> float:
    warm = WarmState(graph, store)
    warm.follow()  # primed, as a worker's first round does
    commit_tail(graph, store, TAIL)
    flow = None

    def take():
        nonlocal flow
        flow = warm.take()
    took = timed_ms(take)
    assert flow is not None and warm.applied == 1, "the warm copy was not handed over"
    return took


def timed_ms(call) -> float:
    t0 = time.perf_counter()
    call()
    return 1000 * (time.perf_counter() - t0)


def main(sizes: list[int]) -> None:
    graph = parse_graph(CHAINED.read_text(), str(CHAINED))
    with tempfile.TemporaryDirectory(prefix="twinflow-bench-") as tmp:
        server = start_answering(start_redis, Path(tmp), 10.0)
        try:
            r = redis.Redis(port=server.port)
            for n in sizes:
                keys = FlowKeys(f"load{n}")
                fill(r, keys, n)
                store = FlowStore(r, keys, "bench")
                runs: dict = {"before": [], "now": [], "hgetall": [], "warm": []}
                for _ in range(5):
                    runs["before"].append(timed_ms(lambda: load_before(store)))
                    runs["now"].append(timed_ms(lambda: MasterFlow.load(graph, store)))
                    runs["hgetall"].append(timed_ms(lambda: r.hgetall(keys.state(NODE))))
                    runs["warm"].append(warm_take_ms(graph, store))
                record = {"entries": n, **{f"{k}_ms": round(statistics.median(v), 1) for k, v in runs.items()}}
                record["speedup"] = round(record["before_ms"] / record["now_ms"], 2)
                record["warm_tail_messages"] = TAIL
                print(json.dumps(record), flush=True)
                save("state_load", record)
                r.delete(*(keys.state(name) for name in graph.nodes), keys.changes, keys.version, keys.processed)
        finally:
            kill_pid(server.pid)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [10_000, 50_000, 200_000])
