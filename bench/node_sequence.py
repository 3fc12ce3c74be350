"""Sequence node: throughput, and per-message cost with 10 and 10,000 open groups.

(a) Throughput (median of 3 passes): 250,000 messages at 10,000/s of
virtual time, driven the way the replay engine drives a node
(``next_deadline``/``on_time`` before each message). Groups are 5,000
customers with a skewed (Zipf-like) share of the traffic; an instance ends
after 30 s without a message (``end.automatic``), so idle customers' groups
close while busy ones keep counting. 1% of the messages have no customer
(``failure``).

(b) Cost per message with N open groups (the node holds no messages, so its
state is one counter per open group): messages go round-robin over N groups
whose instances never end. Median of 101 chunks of 2,000 messages, the two
sizes taking turns chunk by chunk so that noise from other processes (this
machine is shared) falls on both alike.

Run: ``.venv/bin/python bench/node_sequence.py``; prints one JSON line and
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
from twinflow.runtime.nodes.sequence import End, Sequence

THROUGHPUT_MSGS = 250_000
CUSTOMERS = 5_000
RATE = 10_000.0
CYCLE = 20_000  # a multiple of both sizes measured
CHUNK = 2_000
REPEATS = 101


def node(quiet: float) -> Sequence:
    return Sequence("number", group=FieldPath("customer"), start=1, end=End(automatic=quiet), idle=quiet)


def realistic(n: int, seed: int = 1) -> list[tuple[float, Msg]]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(CUSTOMERS)]
    customers = rng.choices(range(CUSTOMERS), weights, k=n)
    events = []
    for i, c in enumerate(customers):
        doc = {"customer": f"c{c}", "amount": 12.5} if rng.random() > 0.01 else {"amount": 12.5}
        events.append((i / RATE, Msg(f"m{i}", doc)))
    return events


def throughput() -> float:
    number = node(30.0)
    events = realistic(THROUGHPUT_MSGS)
    on_message, on_time, next_deadline = number.on_message, number.on_time, number.next_deadline
    start = time.perf_counter()
    for now, msg in events:
        while (d := next_deadline()) is not None and d <= now:
            on_time(d)
        on_message(msg, now)
    return len(events) / (time.perf_counter() - start)


def steady(groups: int):
    """A node with ``groups`` open groups, and a function that sends the next CHUNK messages (us per message)."""
    number = node(1e9)
    on_message = number.on_message
    # Round-robin over every group; the chunks walk through this list and wrap.
    msgs = [Msg(f"m{i}", {"customer": f"c{i % groups}"}) for i in range(CYCLE)]
    for msg in msgs[:groups]:
        on_message(msg, 0.0)
    state = {"now": 0.0, "at": 0}

    def run() -> float:
        state["now"] += 1.0
        now, at = state["now"], state["at"]
        chunk = msgs[at:at + CHUNK]
        state["at"] = (at + CHUNK) % CYCLE
        start = time.perf_counter()
        for msg in chunk:
            on_message(msg, now)
        us = (time.perf_counter() - start) / CHUNK * 1e6
        assert number.open_groups == groups, number.open_groups
        return us

    return run


def costs_us(small: int, large: int) -> tuple[float, float]:
    """Median us per message at both sizes (see common.alternating_medians)."""
    medians = alternating_medians({n: steady(n) for n in (small, large)}, REPEATS)
    return medians[small], medians[large]


def main() -> None:
    rate = statistics.median(throughput() for _ in range(3))  # the machine is shared: median of 3 passes
    at_10, at_10000 = costs_us(10, 10_000)
    record_node("sequence", rate, at_10, at_10000,
                f"3 passes of {THROUGHPUT_MSGS} msgs at 10k/s virtual over {CUSTOMERS} Zipf-weighted "
                "customer groups, end automatic 30 s, 1% without a customer, engine-style ticks; "
                "cost: round-robin over N open groups, median of 101 alternating chunks of 2k msgs")


if __name__ == "__main__":
    main()
