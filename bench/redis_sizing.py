"""What a flow holds in Redis, per thing it holds: the figures the deployment guide sizes Redis by.

A real redis-server on loopback (appendonly off, nothing else in it) and the chained flow
(``examples/cluster-chained.yaml``: history, AND join, action) run by real master steps
(``MasterFlow.run`` and ``FlowStore.commit``, 500 messages a step). Each measure is Redis's own
``used_memory`` before and after, divided by the count:

- ``order_pending``: N orders whose payment has not come: each is one ID-cache key, one history
  entry, one open AND group (the order inside it) and its uplink entry;
- ``pair_done``: N orders and their payments, joined and delivered: two ID-cache keys, two
  history entries, one sink entry with the pair, two uplink entries;
- ``id_cache_key``: the ID cache alone (the keys a step writes, as COMMIT writes them);
- ``history_entry``: the history's hash alone (one entry per identifier of the retention);
- ``uplink_entry``: the uplink stream alone, with a message of the size the producer sends.

Run: ``.venv/bin/python bench/redis_sizing.py [N]`` (default 20000); prints one JSON line and
appends it to ``bench/results/redis_sizing.jsonl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))
from common import save, scratch_redis  # noqa: E402

from twinflow.cluster.master_flow import MasterFlow  # noqa: E402
from twinflow.runtime.flowgraph import load_graph  # noqa: E402
from twinflow.runtime.message import Message  # noqa: E402
from twinflow.runtime.store.flow_keys import FlowKeys  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402
from twinflow.testing.messages import order_or_payment  # noqa: E402

CHAINED = Path(__file__).parents[1] / "examples" / "cluster-chained.yaml"
STEP = 500
NOW = 1_764_000_000.0


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def run_steps(r: redis.Redis, flow_name: str, docs: list[dict]) -> None:
    """Publish ``docs`` to the flow's uplink and run them through master steps, committed."""
    graph = load_graph(CHAINED)
    keys = FlowKeys(flow_name)
    store = FlowStore(r, keys, "bench", id_ttl=86400)
    store.raise_epoch(1)
    bodies = [json.dumps(d).encode() for d in docs]
    positions = store.publish(bodies)
    flow = MasterFlow.load(graph, store)
    for at in range(0, len(docs), STEP):
        chunk = [Message(str(d["id"]), None, p, b, d)
                 for d, p, b in zip(docs[at:at + STEP], positions[at:at + STEP], bodies[at:at + STEP])]
        step = flow.run(chunk, now=NOW + at / 1000, epoch=1)
        store.commit(1, step)
        flow.committed(step)


def per(r: redis.Redis, n: int, fill) -> float:
    r.flushall()
    before = used(r)
    fill()
    return round((used(r) - before) / n, 1)


def measure(r: redis.Redis, n: int) -> dict:
    orders = [order_or_payment(2 * i) for i in range(n)]  # even: the orders of pairs 0..n-1
    both = [order_or_payment(i) for i in range(2 * n)]
    assert {d["type"] for d in orders} == {"order"}, "order_or_payment's even messages are orders"
    out = {"n": n}
    out["order_pending"] = per(r, n, lambda: run_steps(r, "size-a", orders))
    out["pair_done"] = per(r, n, lambda: run_steps(r, "size-b", both))

    def id_cache():
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.set(f"tf:{{size-c}}:id:o{i:07d}", 1, ex=86400)
        pipe.execute()

    def history():
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.hset("tf:{size-d}:state:guard", json.dumps(["guard", f"doc-{i}"]), json.dumps([NOW + i, True, True]))
        pipe.execute()

    def uplink():
        pipe = r.pipeline(transaction=False)
        for d in orders:
            pipe.xadd("tf:{size-e}:uplink", {"data": json.dumps(d)})
        pipe.execute()

    out["id_cache_key"] = per(r, n, id_cache)
    out["history_entry"] = per(r, n, history)
    out["uplink_entry"] = per(r, n, uplink)
    out["message_bytes"] = round(sum(len(json.dumps(d)) for d in orders) / n, 1)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    with scratch_redis("twinflow-sizing-") as (port, _):
        result = measure(redis.Redis(port=port), n)
    print(json.dumps(result))
    save("redis_sizing", result)


if __name__ == "__main__":
    main()
