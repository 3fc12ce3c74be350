"""Escalation throughput: claims per second from one sender to one worker's gRPC server.

Sender and server run in this one process on loopback (the server records each claim, as the
worker's claim logic would), so the figure is the escalation path's own cost, not a peer's.
Each run sends ``--claims`` claims in batches of 100, as a master's steps send them, and waits
until every one is acknowledged; the median of ``--runs`` runs is saved.

    .venv/bin/python bench/escalation.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import save  # noqa: E402

from twinflow.cluster.escalation import EscalationSender  # noqa: E402
from twinflow.cluster.escalation_servicer import EscalationServicer  # noqa: E402
from twinflow.cluster.grpc_server import create_server  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402

FLOW = "orders"
CHUNK = 100


def one_run(claims: int) -> float:
    """Claims per second for one sender and one server, from the first send to the last ack."""
    received = [0]
    lock = threading.Lock()

    def on_claims(epoch: int, batch) -> int:
        with lock:
            received[0] += len(batch)
        return len(batch)

    server, port = create_server("127.0.0.1:0", escalation=EscalationServicer(FLOW, on_claims))
    sender = EscalationSender(FLOW, "node-a", lambda: 7, lambda: {"node-b": f"127.0.0.1:{port}"})
    try:
        if not wait_for(lambda: sender.stats()["targets"]["node-b"]["connected"], 10.0):
            raise RuntimeError("the escalation stream did not open within 10 s")
        made = [(f"m{i}", str(1_700_000_000_000 + i), f"{1_700_000_000_000 + i}-0", "all") for i in range(claims)]
        start = time.perf_counter()
        for i in range(0, claims, CHUNK):
            sender.send(made[i:i + CHUNK])
        if not sender.flush(60.0):
            raise RuntimeError(f"not every claim was acknowledged within 60 s: {sender.stats()}")
        elapsed = time.perf_counter() - start
        if received[0] != claims:
            raise RuntimeError(f"the server received {received[0]} of {claims} claims")
        return claims / elapsed
    finally:
        sender.stop()
        server.stop(None).wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--claims", type=int, default=200_000)
    args = ap.parse_args()
    rates = [one_run(args.claims) for _ in range(args.runs)]
    record = {"claims": args.claims, "runs": args.runs, "claims_per_s_median": round(statistics.median(rates)),
              "claims_per_s": [round(r) for r in rates]}
    print(record)
    save("escalation", record)


if __name__ == "__main__":
    main()
