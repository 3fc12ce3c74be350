"""Decoding alone: ``message.decode`` over the chained flow's bodies, one core, no server.

What every peer does first with each uplink entry (the master before its graph,
a worker before its bake): the bounds checks, the JSON parse, the ID and the
sort key. Prints the best of ``--repeat`` passes in microseconds per message
(the best pass: this machine's other work only ever adds to it).

    .venv/bin/python bench/decode.py --messages 20000 --repeat 9

Figures: docs/performance.md.
"""

import argparse
import json
import time

from twinflow.runtime.message import MessageSpec, decode
from twinflow.testing.messages import order_or_payment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    spec = MessageSpec(id_path="id", key_path="seq")
    # Sequence numbers of a flow that has run a while: six-digit IDs and keys.
    rows = [(f"1-{i}", json.dumps(order_or_payment(100_000 + i), separators=(",", ":")).encode())
            for i in range(args.messages)]
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for position, body in rows:
            decode(position, body, spec)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"messages": args.messages, "decode_us": round(best / args.messages * 1e6, 2)}))


if __name__ == "__main__":
    main()
