"""An external service: publish orders and payments into a flow, then wait for them in its sink.

It runs against the chained flow of `make demo` (examples/cluster-chained.yaml:
history -> AND join of an order and its payment -> action). `make demo` stops
its cluster when it ends, so start the same cluster yourself (docs/getting-started/first-flow.md,
"Run it on two peers"):

    .venv/bin/twinflow services up
    .venv/bin/twinflow run examples/cluster-chained.yaml --peer-id a &
    .venv/bin/twinflow run examples/cluster-chained.yaml --peer-id b &
    .venv/bin/twinflow status examples/cluster-chained.yaml     # until one is master
    .venv/bin/python examples/external_service.py --pairs 100

It publishes ``--pairs`` orders and their payments through the peers' Ingest
service (twinflow.client.Client: batches, retries, failover between the
peers), then reads the flow's sink stream ``tf:{orders}:sink`` from Redis
until every pair has left the flow as one joined message, or ``--deadline``
seconds pass. It exits 0 when all arrived, 1 when some did not.

Redis comes from ``--redis``, else ``TWINFLOW_REDIS``, else the services
``twinflow services up`` recorded in .twinflow/services.json. The peers'
gRPC addresses come from ``--peer HOST:PORT`` (repeatable), else from the
live peers' status in Redis (``tf:{orders}:node:<id>``, field
``grpc_address``). On peers that ask for TLS and tokens, pass ``--ca`` (the CA
file that signed the peers' certificates) and ``--token env:NAME`` or
``--token file:PATH`` (the ingest token, never its value).

Every run uses fresh message IDs, so that running it again publishes new
messages, not repeats (which the flow's history node would set aside as
duplicates).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable

import redis

from twinflow.client import Client, PublishError
from twinflow.grpc_security import NO_SECURITY, GrpcSecurity, TlsFiles


def orders_and_payments(pairs: int, run: str, first_seq: int) -> list[dict]:
    """``pairs`` orders, each followed by its payment; the IDs carry ``run`` so that every run is new.

    ``seq`` (the worker's sort key in the chained flow) increases through the run.
    """
    docs = []
    for k in range(pairs):
        order_id = f"{run}-{k}"
        docs.append({"id": f"{run}-o{k}", "uuid": f"order-{order_id}", "type": "order",
                     "order_id": order_id, "seq": first_seq + 2 * k})
        docs.append({"id": f"{run}-p{k}", "uuid": f"payment-{order_id}", "type": "payment",
                     "order_id": order_id, "seq": first_seq + 2 * k + 1})
    return docs


def delivered_ids(entries: Iterable[tuple[bytes, dict]]) -> set[str]:
    """The message IDs in sink entries; a joined group's entry has its members' IDs joined by ``+``."""
    ids: set[str] = set()
    for _, fields in entries:
        ids.update(fields[b"id"].decode().split("+"))
    return ids


def last_entry_id(r: redis.Redis, key: str) -> str:
    """The ID of the stream's newest entry ("0-0" when empty): reading after it sees only what follows."""
    newest = r.xrevrange(key, count=1)
    return newest[0][0].decode() if newest else "0-0"


def wait_for_sink(r: redis.Redis, sink_key: str, ids: set[str], deadline_s: float, after: str = "0-0",
                  block_ms: int = 200, monotonic: Callable[[], float] = time.monotonic) -> set[str]:
    """Read the sink after ``after`` until every one of ``ids`` is there; return those still missing.

    Blocking reads (XREAD BLOCK) wait for new entries instead of polling; the
    last entry read is remembered, so every entry is read once.
    """
    missing = set(ids)
    end = monotonic() + deadline_s
    while missing and monotonic() < end:
        wait_ms = max(1, min(block_ms, int((end - monotonic()) * 1000)))
        for _, entries in r.xread({sink_key: after}, count=1000, block=wait_ms) or []:
            missing -= delivered_ids(entries)
            after = entries[-1][0].decode()
    return missing


def node_addresses(r: redis.Redis, flow: str) -> list[str]:
    """The gRPC addresses of the flow's live peers, from their status in Redis."""
    addresses = []
    for peer_id in sorted(r.smembers(f"tf:{{{flow}}}:nodes")):
        address = r.hget(f"tf:{{{flow}}}:node:{peer_id.decode()}", "grpc_address")
        if address:  # a peer whose status expired has left
            addresses.append(address.decode())
    return addresses


def redis_url(flag: str | None) -> str:
    if flag:
        return flag
    if os.environ.get("TWINFLOW_REDIS"):
        return os.environ["TWINFLOW_REDIS"]
    recorded = Path(".twinflow") / "services.json"
    if recorded.exists():
        from twinflow.testing.services import LocalServices

        return LocalServices.load(recorded).redis_url
    raise SystemExit("no Redis: pass --redis, set TWINFLOW_REDIS, or run `twinflow services up`")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flow", default="orders")
    p.add_argument("--sink", default="sink", help="the action's sink stream (flow file: sink.stream)")
    p.add_argument("--pairs", type=int, default=100, help="orders to publish, each with its payment")
    p.add_argument("--peer", "--node", dest="peer", action="append", default=[],
                   help="a peer's gRPC HOST:PORT (repeatable; --node is its old name)")
    p.add_argument("--redis", help="redis:// URL of the flow's Redis")
    p.add_argument("--deadline", type=float, default=60.0, help="seconds to wait for the sink")
    p.add_argument("--ca", help="CA file of the peers' TLS certificates")
    p.add_argument("--token", help="the ingest token as file:PATH or env:NAME")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be at least 1")

    r = redis.Redis.from_url(redis_url(args.redis))
    addresses = args.peer or node_addresses(r, args.flow)
    if not addresses:
        print(f"no live peer of flow {args.flow!r} in Redis; pass --peer HOST:PORT", file=sys.stderr)
        return 1
    security = NO_SECURITY
    if args.ca or args.token:
        security = GrpcSecurity.from_refs(tls=TlsFiles(ca=args.ca) if args.ca else None,
                                          token_refs={"ingest": args.token} if args.token else None)

    sink_key = f"tf:{{{args.flow}}}:{args.sink}"
    after = last_entry_id(r, sink_key)  # only what this run causes counts
    docs = orders_and_payments(args.pairs, uuid.uuid4().hex[:8], first_seq=time.time_ns() // 1000)
    began = time.monotonic()
    try:
        with Client(addresses, args.flow, security) as client:
            positions = client.publish(docs, batch_size=500, deadline_s=30.0)
    except PublishError as exc:
        # Retrying the whole run is safe: the flow delivers a message ID once however often it is sent.
        print(f"publishing failed: {exc}", file=sys.stderr)
        return 1
    print(f"published {len(positions)} messages to {args.flow} through {', '.join(addresses)} "
          f"(uplink {positions[0]} .. {positions[-1]})")

    missing = wait_for_sink(r, sink_key, {d["id"] for d in docs}, args.deadline, after=after)
    if missing:
        print(f"{len(missing)} of {len(docs)} messages not in {sink_key} after {args.deadline:.0f} s "
              f"(e.g. {sorted(missing)[:5]})", file=sys.stderr)
        return 1
    print(f"all {len(docs)} messages left the flow through {sink_key} "
          f"{time.monotonic() - began:.2f} s after the first publish")
    return 0


if __name__ == "__main__":
    sys.exit(main())
