"""How fast the join node is, and whether its cost per message stays flat as it holds more.

(a) Throughput: about 296,000 messages of an AND join over three types, driven the
way replay drives a node (every deadline fired at its time before the next
message). 100,000 orders open at 5,000 per virtual second; each sends order,
payment and shipment in random order within 2 s; 5 % lose one message and
expire after the 5 s time-out, 1 % send a payment twice, 1 % send an
unlisted type instead of the order (and expire), 0.5 % lack the activation ID. The same stream through an XOR
and an OR join is reported alongside.

(b) Cost per message with 10 and with 10,000 open activations: a steady
state in which, every virtual second, the oldest activation (holding one
message) expires, a new one opens, and another completes a three-way join,
so the node keeps exactly N pending messages. Median of 7 repetitions,
the two sizes taking turns.

    .venv/bin/python bench/node_join.py
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import record_node  # noqa: E402

from twinflow.runtime.nodes.base import Msg  # noqa: E402
from twinflow.runtime.nodes.join import AndJoin, OrJoin, XorJoin  # noqa: E402

TYPES = ("order", "payment", "shipment")
ORDERS, RATE, SPREAD, TIMEOUT = 100_000, 5_000.0, 2.0, 5.0


def workload(seed: int = 7) -> list[tuple[float, Msg]]:
    """The throughput stream, sorted by arrival time."""
    rng = random.Random(seed)
    events = []
    for o in range(ORDERS):
        start, act = o / RATE, f"o{o}"
        kinds = list(TYPES)
        roll = rng.random()
        if roll < 0.05:
            kinds.pop(rng.randrange(3))
        elif roll < 0.06:
            kinds.append("payment")
        elif roll < 0.07:
            kinds[0] = "refund"
        for n, kind in enumerate(kinds):
            doc = {"id": f"{act}-{n}", "kind": kind, "order_id": act, "amount": n}
            if roll > 0.995:
                del doc["order_id"]
            events.append((start + rng.random() * SPREAD, Msg(doc["id"], doc)))
    events.sort(key=lambda e: e[0])
    return events


def drive(node, events) -> int:
    """Feed the stream like replay does; returns how many messages left the node."""
    left = 0
    for at, msg in events:
        while (d := node.next_deadline()) is not None and d <= at:
            for e in node.on_time(d):
                left += len(e.msgs)
        for e in node.on_message(msg, at):
            left += len(e.msgs)
    return left + sum(len(e.msgs) for e in node.on_time(float("inf")))


def throughput(make, events) -> float:
    best = 0.0
    for _ in range(3):
        node = make()
        gc.collect()
        t0 = time.perf_counter()
        left = drive(node, events)
        elapsed = time.perf_counter() - t0
        assert left == len(events), "conservation broken"
        best = max(best, len(events) / elapsed)
    return best


def cost_sample(pending: int, steps: int = 20_000) -> float:
    """Microseconds per message with ``pending`` messages held (one per open activation)."""

    def doc(kind, act):
        return Msg(f"{kind}-{act}", {"kind": kind, "order_id": act})

    # One virtual second per step and a time-out of ``pending`` seconds:
    # step k expires the activation opened at k - pending.
    node = AndJoin("bench", TYPES, type_field="kind", activation_field="order_id", timeout=float(pending))
    for a in range(pending):
        node.on_message(doc("order", a), float(a))
    batch = [(float(pending + k), doc("order", pending + k), doc("order", f"c{k}"), doc("payment", f"c{k}"),
              doc("shipment", f"c{k}")) for k in range(steps)]
    assert node.pending() == pending
    gc.collect()
    t0 = time.perf_counter()
    for now, opener, a, b, c in batch:
        node.on_time(now)
        node.on_message(opener, now)
        node.on_message(a, now)
        node.on_message(b, now)
        node.on_message(c, now)
    elapsed = time.perf_counter() - t0
    assert node.pending() == pending, "the steady state drifted"
    return elapsed / (4 * steps) * 1e6


def costs(sizes=(10, 10_000), reps: int = 7) -> dict[int, float]:
    """Median cost per size; the sizes take turns so that a busy machine slows both alike."""
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(reps):
        for n in sizes:
            samples[n].append(cost_sample(n))
    return {n: statistics.median(v) for n, v in samples.items()}


def main() -> None:
    events = workload()
    fields = {"type_field": "kind", "activation_field": "order_id", "timeout": TIMEOUT}
    rates = {
        "and": throughput(lambda: AndJoin("bench", TYPES, **fields), events),
        "xor": throughput(lambda: XorJoin("bench", TYPES, **fields), events),
        "or": throughput(lambda: OrJoin("bench", TYPES, type_field="kind"), events),
    }
    cost = costs()
    at_10, at_10000 = cost[10], cost[10_000]
    record_node("join", rates["and"], at_10, at_10000,
                f"AND of 3 types, {len(events)} msgs, {ORDERS} activations at {RATE:g}/s spread {SPREAD:g} s, "
                f"time-out {TIMEOUT:g} s, 5% expire, 1% duplicate, 1% nohit, 0.5% failure; "
                "cost: steady state of expire + open + 3-way join per step",
                throughput_by_join_type={k: round(v) for k, v in rates.items()})


if __name__ == "__main__":
    main()
