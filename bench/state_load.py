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

and the HGETALL alone (what no change in Python can remove).

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
        node.on_message(Msg(f"m{i}", {"uuid": f"order-{i:08d}"}), now=1_764_000_000.0 + i / 500)
    entries = node.changed_state()
    pipe = r.pipeline(transaction=False)
    for i, (field, value) in enumerate(entries.items()):
        pipe.hset(keys.state(NODE), field, json_text.compact(value))
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


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
                runs: dict = {"before": [], "now": [], "hgetall": []}
                for _ in range(5):
                    runs["before"].append(timed_ms(lambda: load_before(store)))
                    runs["now"].append(timed_ms(lambda: MasterFlow.load(graph, store)))
                    runs["hgetall"].append(timed_ms(lambda: r.hgetall(keys.state(NODE))))
                record = {"entries": n, **{f"{k}_ms": round(statistics.median(v), 1) for k, v in runs.items()}}
                record["speedup"] = round(record["before_ms"] / record["now_ms"], 2)
                print(json.dumps(record), flush=True)
                save("state_load", record)
                r.delete(keys.state(NODE))
        finally:
            kill_pid(server.pid)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [10_000, 50_000, 200_000])
