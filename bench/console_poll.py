"""What one poll of the operator console costs: its snapshot's time and Redis commands.

A scratch redis-server holds what a running cluster of the chained flow leaves: two peers'
statuses (one a master), every outlink stream with ``--entries`` entries, the uplink, a
full events stream (1,000 records) and an audit. The console's view then answers
``--polls`` snapshots, directly (``ConsoleView.snapshot``) and over HTTP
(``GET /console/api/snapshot`` on loopback); each is timed, and Redis's own command count
(``INFO stats``' ``total_commands_processed``) says how many commands one poll sends.

    .venv/bin/python bench/console_poll.py            # writes bench/results/console_poll.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))
from common import save, scratch_redis  # noqa: E402
from twinflow.cluster.console.access import ConsoleAccess
from twinflow.cluster.console.app import ConsoleApp
from twinflow.cluster.console.server import ConsoleServer
from twinflow.cluster.console.snapshot import ConsoleView
from twinflow.cluster.master_flow import outlink_streams
from twinflow.cluster.operator_stores import operator_stores
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.testing.messages import CHAINED


def fill(url: str, graph, entries: int) -> None:
    """What a running pair of the chained flow leaves in Redis (see the module doc)."""
    [store] = operator_stores(graph, url, who="peer-a")
    r = store.r
    now = time.time()
    for peer, role in (("peer-a", "master"), ("peer-b", "worker")):
        FlowStore(r, store.keys, peer).write_status({
            "flow": graph.name, "peer_id": peer, "role": role, "epoch": 2, "at": now, "grpc_address": f"{peer}:7070",
            "suspended": {}, "rule_pending": {"all": 3}, "links": {"guard.new": entries, "match.joined": entries // 2},
            "pending_nodes": {"match": {"kind": "join", "held": 12, "groups": 12}}}, ttl_s=600)
    for stream in [store.keys.uplink, *outlink_streams(graph, store.keys).values()]:
        pipe = r.pipeline(transaction=False)
        for i in range(entries):
            pipe.xadd(stream, {"id": f"m{i}", "epoch": 2, "node": "peer-a"})
        pipe.execute()
    store.add_events([{"event": "promoted" if i % 2 else "first_write", "peer": "peer-a", "epoch": i // 2 + 1,
                       "at": now - 1000 + i, "promoted_at": now - 1000 + i} for i in range(1000)])


def commands(r: redis.Redis) -> int:
    return int(r.info("stats")["total_commands_processed"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--polls", type=int, default=200)
    p.add_argument("--entries", type=int, default=10_000, help="entries in each stream")
    args = p.parse_args()
    graph = load_graph(CHAINED)
    with scratch_redis("tf-console-bench-") as (port, _):
        url = f"redis://127.0.0.1:{port}/0"
        fill(url, graph, args.entries)
        view = ConsoleView(graph, operator_stores(graph, url, who="console"))
        probe = redis.Redis(port=port)
        view.snapshot()  # the rates' first sample, the connections made
        before = commands(probe)
        direct = []
        for _ in range(args.polls):
            t0 = time.perf_counter()
            snap = view.snapshot()
            direct.append(time.perf_counter() - t0)
        per_poll = (commands(probe) - before - 1) / args.polls  # less the INFO of the count itself
        assert snap["redis"] == "ok" and len(snap["peers"]) == 2 and snap["failovers"], snap["redis"]
        server = ConsoleServer(ConsoleApp(view, ConsoleAccess(None)), "127.0.0.1:0")
        try:
            http, size = [], 0
            for _ in range(args.polls):
                t0 = time.perf_counter()
                with urllib.request.urlopen(server.url + "api/snapshot", timeout=10) as reply:
                    size = len(reply.read())
                http.append(time.perf_counter() - t0)
        finally:
            server.stop()

    def ms(xs: list[float], q: float) -> float:
        return round(statistics.quantiles(xs, n=100)[int(q) - 1] * 1000, 2) if q < 100 else round(max(xs) * 1000, 2)

    record = {"bench": "console_poll", "polls": args.polls, "entries": args.entries,
              "outlink_streams": len(view.streams[0]), "redis_commands_per_poll": round(per_poll, 1),
              "snapshot_ms_p50": round(statistics.median(direct) * 1000, 2), "snapshot_ms_p99": ms(direct, 99),
              "http_ms_p50": round(statistics.median(http) * 1000, 2), "http_ms_p99": ms(http, 99),
              "answer_bytes": size}
    print(json.dumps(record))
    save("console_poll", record)


if __name__ == "__main__":
    main()
