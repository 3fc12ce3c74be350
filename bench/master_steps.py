"""The master's step loop alone: decode and run chained batches against a local Redis, no Spark.

What the master's driver does with a batch (``uplink_rows.decode_rows``, then
``master_session.MasterSession.run_batch`` with the peer's real writer threads and
COMMIT script), timed per message: decoding, the whole step loop, the
part of it spent in the COMMIT call, and Redis's CPU meanwhile. Figures: docs/performance.md.

    .venv/bin/python bench/master_steps.py --messages 20000 --batches 3
    .venv/bin/python bench/master_steps.py --without-change-log   # steps that write no change log (A/B)
"""

import argparse
import json
import tempfile
import time

import redis

from twinflow.testing.messages import CHAINED, order_or_payment
from twinflow.cluster.master_session import MasterSession
from twinflow.cluster.write_pool import write_pool
from twinflow.cluster.on_cluster import flow_keys
from twinflow.testing.services import LocalServices
from twinflow.cluster.uplink_rows import decode_rows
from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.store.flow_store import FlowStore


class TimedSession(MasterSession):
    """A master session on a real store that times its COMMIT calls."""

    def __init__(self, graph, store: FlowStore):
        super().__init__(graph, store, 1, write_pool())
        self.load()
        self.commit_s = 0.0
        commit = store.commit

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return commit(*args, **kwargs)
            finally:
                self.commit_s += time.perf_counter() - t
        store.commit = timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000, help="per batch")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--without-change-log", action="store_true",
                    help="steps that write no change log, to measure what it costs")
    args = ap.parse_args()
    services = LocalServices.start(base_dir=tempfile.mkdtemp(prefix="twinflow-steps-"), deadline_s=30,
                                   zookeeper=False)
    try:
        graph = parse_graph(CHAINED.read_text())
        client = redis.Redis.from_url(services.redis_url)
        keys = flow_keys(graph)
        session = TimedSession(graph, FlowStore(client, keys, "bench", id_ttl=graph.cluster.message.id_ttl))
        if args.without_change_log:
            session.flow.logged = ()
        seq = 0
        for batch in range(args.batches):
            bodies = [json.dumps(order_or_payment(seq + i), separators=(",", ":")).encode()
                      for i in range(args.messages)]
            seq += args.messages
            pipe = client.pipeline(transaction=False)
            for body in bodies:
                pipe.xadd(keys.uplink, {"data": body})
            rows = [(p.decode(), b, len(b)) for p, b in zip(pipe.execute(), bodies)]
            session.commit_s = 0.0
            redis_cpu = _redis_cpu_s(client)
            t0 = time.perf_counter()
            msgs, _, _ = decode_rows(rows, graph.message)
            t1 = time.perf_counter()
            out = session.run_batch(msgs, rows[-1][0], time.time)
            if out.refused is not None:
                raise out.refused
            t2 = time.perf_counter()
            n = args.messages
            print(json.dumps({"batch": batch, "decode_us": round(1e6 * (t1 - t0) / n, 1),
                              "steps_us": round(1e6 * (t2 - t1) / n, 1),
                              "commit_call_us": round(1e6 * session.commit_s / n, 1),
                              "redis_cpu_us": round(1e6 * (_redis_cpu_s(client) - redis_cpu) / n, 1)}), flush=True)
    finally:
        services.stop()


def _redis_cpu_s(client: redis.Redis) -> float:
    """Redis's own CPU seconds so far (it shares the cores with the master in a peer)."""
    cpu = client.info("cpu")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"]


if __name__ == "__main__":
    main()
