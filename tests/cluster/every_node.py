"""Events for examples/cluster-every-node.yaml, and what left the flow, read the same way from
``twinflow replay`` output and from a live cluster's Redis streams."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

from twinflow.cluster.master_flow import outlink_streams
from twinflow.runtime.flowgraph import FlowGraph, load_graph
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.replay import replay

FLOW = Path(__file__).parents[2] / "examples" / "cluster-every-node.yaml"


def events(seed: int = 7) -> list[dict]:
    """Documents for every branch, some left pending (an order without payment, a mail
    group without all its notifications, a step group with a gap), plus duplicates and bad input."""
    rnd = random.Random(seed)
    docs: list[dict] = []
    for i in range(20):
        docs.append({"id": f"o{i}", "type": "order", "order_id": i})
        if i % 2 == 0:
            docs.append({"id": f"p{i}", "type": "payment", "order_id": i})
    for g in range(10):
        docs.append({"id": f"imf{g}", "type": "IMF", "recipients": "a@x, b@y"})
        docs.append({"id": f"mdn{g}a", "type": "MDN", "parent_id": f"imf{g}", "final_recipient": "a@x"})
        if g % 2 == 0:
            docs.append({"id": f"mdn{g}b", "type": "DSN", "parent_id": f"imf{g}", "final_recipient": "b@y"})
    docs.append({"id": "lost-dsn", "type": "DSN", "parent_id": "never", "final_recipient": "a@x"})
    for g in range(6):
        numbers = [0, 1, 2, 3] if g % 3 else [0, 2, 3]  # every third group misses 1
        rnd.shuffle(numbers)
        docs += [{"id": f"s{g}-{n}", "type": "step", "grp": f"g{g}", "n": n} for n in numbers]
    for k in range(12):
        docs.append({"id": f"a{k}", "type": "alert", "host": f"h{k % 4}"})
    for k in range(15):
        docs.append({"id": f"r{k}", "type": "reading", "n": rnd.randint(0, 30)})
    rnd.shuffle(docs)
    # Duplicates (same business UUID, a new message ID) and bad input, spread through.
    for k, doc in enumerate(rnd.sample(docs, 6)):
        docs.insert(rnd.randrange(len(docs)), {**doc, "id": f"dup{k}", "uuid": doc["id"]})
    for bad in ({"id": "bad-step", "type": "step", "grp": "g9", "n": "one"},
                {"id": "bad-order", "type": "order"},
                {"id": "bad-mail", "type": "MDN", "final_recipient": "a@x"}):
        docs.insert(rnd.randrange(len(docs)), bad)
    for seq, doc in enumerate(docs):  # the claim pair's key: uplink order
        doc["seq"] = seq
    for doc in docs:  # the history's UUID: the original's ID for a duplicate, else the message ID
        doc.setdefault("uuid", doc["id"])
    return docs


def graph() -> FlowGraph:
    return load_graph(FLOW)


def unlinked(graph: FlowGraph) -> list[tuple[str, str]]:
    """Every (node, outlink) through which messages leave the flow."""
    return list(outlink_streams(graph, FlowKeys(graph.name)))


def replay_outputs(docs: list[dict]) -> dict[tuple[str, str], list[str]]:
    """What ``twinflow replay`` sends out of each unlinked outlink (a group as 'id+id'), in order."""
    g = graph()
    lines = [json.dumps({"at": i * 0.001, **doc}) for i, doc in enumerate(docs)]
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    leaving = set(unlinked(g))
    for line in replay(g, lines):
        if (line["node"], line["outlink"]) in leaving:
            out[(line["node"], line["outlink"])].append(line.get("id") or "+".join(line["ids"]))
    return dict(out)


def stream_suffix(graph: FlowGraph, node: str, outlink: str) -> str:
    """The output stream's key without the flow's prefix."""
    keys = FlowKeys(graph.name)
    return outlink_streams(graph, keys)[(node, outlink)][len(keys.prefix):]
