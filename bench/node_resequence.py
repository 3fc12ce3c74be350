"""Resequence node: throughput, and per-message cost with 10 and 10,000 held messages.

(a) Throughput (median of 3 passes): 250,000 messages at 10,000/s of
virtual time, driven the way the replay engine drives a node
(``next_deadline``/``on_time`` before each message). Batches of 20 messages
(numbers 0..19, literal end 19); each message is delayed by up to 1 ms of
jitter (ten messages' time), so 54% arrive before a lower number of their
batch and are held. 0.5% are lost (the 2 s missing-message time-out fires,
the rest of the batch leaves through ``expired``), 0.5% are redelivered
(duplicates: ``failure``), 0.5% have no sequence number (``failure``).

(b) Cost per message in a steady state holding N messages: N groups each
hold number 1 while waiting for 0; each step opens a new group (its 1 is
held) and completes the oldest (its 0 releases both, literal end 1). Median
of 101 chunks of 1,000 steps (2,000 messages), the two sizes taking turns
chunk by chunk so that noise from other processes (this machine is shared)
falls on both alike.

Run: ``.venv/bin/python bench/node_resequence.py``; prints one JSON line and
appends it to ``bench/results/nodes.jsonl``.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import alternating_medians, record_node  # noqa: E402

from twinflow.runtime.fields import FieldPath
from twinflow.runtime.nodes.base import Msg
from twinflow.runtime.nodes.resequence import Resequence
from twinflow.runtime.nodes.sequence import End

THROUGHPUT_MSGS = 250_000
BATCH = 20
RATE = 10_000.0
JITTER = 0.001
COST_STEPS = 1_000
REPEATS = 101


def node(end: int, missing_timeout: float) -> Resequence:
    return Resequence("reorder", number=FieldPath("seq"), group=FieldPath("batch"), start=0,
                      end=End(literal=end), missing_timeout=missing_timeout, idle=None)


def realistic(n: int, seed: int = 1) -> list[tuple[float, Msg]]:
    rng = random.Random(seed)
    events = []
    for i in range(n):
        sent_at = i / RATE
        batch, seq = divmod(i, BATCH)
        r = rng.random()
        if r < 0.005:
            continue  # lost
        doc = {"batch": f"b{batch}", "seq": seq, "amount": 12.5} if r > 0.01 else {"batch": f"b{batch}"}
        events.append((sent_at + rng.random() * JITTER, Msg(f"m{i}", doc)))
        if 0.01 < r < 0.015:
            events.append((sent_at + rng.random() * JITTER, Msg(f"m{i}-again", doc)))
    events.sort(key=lambda e: e[0])
    return events


def throughput() -> float:
    reorder = node(BATCH - 1, 2.0)
    events = realistic(THROUGHPUT_MSGS)
    on_message, on_time, next_deadline = reorder.on_message, reorder.on_time, reorder.next_deadline
    start = time.perf_counter()
    for now, msg in events:
        while (d := next_deadline()) is not None and d <= now:
            on_time(d)
        on_message(msg, now)
    while (d := next_deadline()) is not None:
        on_time(d)
    elapsed = time.perf_counter() - start
    assert reorder.pending() == 0
    return len(events) / elapsed


def steady(held: int):
    """A node holding ``held`` messages, and a function that runs 1,000 steps and returns us per message."""
    reorder = node(1, 1e9)
    on_message = reorder.on_message
    total = held + COST_STEPS * REPEATS
    ones = [Msg(f"g{g}-1", {"batch": g, "seq": 1}) for g in range(total)]
    zeros = [Msg(f"g{g}-0", {"batch": g, "seq": 0}) for g in range(total)]
    for g in range(held):
        on_message(ones[g], 0.0)
    state = {"next": held}

    def run() -> float:
        base = state["next"]
        state["next"] += COST_STEPS
        start = time.perf_counter()
        for g in range(base, base + COST_STEPS):
            on_message(ones[g], 1.0)
            on_message(zeros[g - held], 1.0)
        us = (time.perf_counter() - start) / (2 * COST_STEPS) * 1e6
        assert reorder.pending() == held, reorder.pending()
        return us

    return run


def costs_us(small: int, large: int) -> tuple[float, float]:
    """Median us per message at both sizes (see common.alternating_medians)."""
    medians = alternating_medians({n: steady(n) for n in (small, large)}, REPEATS)
    return medians[small], medians[large]


def main() -> None:
    rate = statistics.median(throughput() for _ in range(3))  # the machine is shared: median of 3 passes
    at_10, at_10000 = costs_us(10, 10_000)
    record_node("resequence", rate, at_10, at_10000,
                f"3 passes of {THROUGHPUT_MSGS} msgs at 10k/s virtual in batches of {BATCH} (literal end), "
                "0-1 ms jitter (54% held), 0.5% lost (2 s missing timeout, expired), "
                "0.5% duplicated, 0.5% without a number, engine-style ticks; "
                "cost: N groups each holding one message, one hold + one release of two per step, "
                "median of 101 alternating chunks of 2k msgs")


if __name__ == "__main__":
    main()
