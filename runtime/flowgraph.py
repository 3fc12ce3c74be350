"""A flow as a graph of nodes: which node reads the input, and where each outlink leads.

::

    flow: orders
    input: dedupe                 # default: the first node listed
    message: {id: id}             # field path of each message's ID (default "id"), limits
    nodes:
      dedupe:
        type: history
        links: {new: join}        # outlink -> next node; unlinked outlinks leave the flow
      join:
        type: join
        ...

The same file runs on the cluster (``twinflow run``) once it has an
``uplink`` section; the cluster's sections, and the claim pair (a ``sort``
with ``pairs_with``, the worker's half, which replay never feeds), are read
by ``runtime/cluster_spec.py``. There is one flow format and one loader.

Loading builds every node (each validates its own parameters) and checks the
links: a link must start at an outlink the node has and end at a node of the
flow, and links must not form a cycle (a message must always leave the flow).
Any problem raises FlowFileError with file, line, field and reason before
anything runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from .cluster_spec import ClusterSpec, parse_cluster, read_message, read_pair
from .fields import FieldPath
from .message import MessageSpec
from .nodes import KINDS, builder
from .nodes.base import Node
from .params import NAME, Doc, FlowFileError, Params


@dataclass
class FlowGraph:
    name: str
    input: str
    id_path: FieldPath
    nodes: dict[str, Node]
    links: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> outlink -> node
    source: str = "<string>"
    message: MessageSpec = field(default_factory=MessageSpec)
    cluster: ClusterSpec | None = None   # None: the file has no uplink (replay only)
    text: str = ""

    def fresh(self) -> "FlowGraph":
        """The same flow with every node new and empty (a master that takes over loads state into it)."""
        return parse_graph(self.text, self.source)


def parse_graph(text: str, file: str = "<string>") -> FlowGraph:
    doc = Doc(text, file)
    top = Params(doc, "", doc.value).only("flow", "input", "message", "nodes", "uplink", "cluster", "failure",
                                        "security", "audit", "notices")
    name = top.name("flow")
    message = read_message(top)
    id_path = top.section("message", default={}).field_path("id", FieldPath("id"))
    raw_nodes = top.get("nodes", dict, check=bool, why="must define at least one node")

    nodes: dict[str, Node] = {}
    links: dict[str, dict[str, str]] = {}
    all_nodes = top.section("nodes")
    kinds = {k: v.get("type") if isinstance(v, dict) else None for k, v in raw_nodes.items()}
    pair = None
    for node_name in raw_nodes:
        if not NAME.fullmatch(str(node_name)):
            raise all_nodes.error(node_name, "a node name must be 1-64 letters, digits, '_', '-' or '.'")
        n = all_nodes.section(node_name)
        kind = n.choice("type", KINDS)
        if kind == "sort" and n.has("pairs_with"):
            if pair is not None:
                raise n.error("pairs_with", f"node {pair.sort!r} already pairs with {pair.action!r} "
                                            f"(a flow has one claim pair)")
            pair = read_pair(n, kinds, message)
            continue
        nodes[node_name] = builder(kind)(node_name, node_params(n))
        node_links = n.section("links", default={})
        for outlink, target in node_links.value.items():
            if outlink not in nodes[node_name].outlinks:
                raise node_links.error(outlink, f"{kind} has no outlink {outlink!r} "
                                                f"(it has: {', '.join(nodes[node_name].outlinks)})")
            if not isinstance(target, str) or target not in raw_nodes:
                raise node_links.error(outlink, f"links to {target!r}, which is not a node of this flow")
            if pair is not None and target == pair.sort or kinds.get(target) == "sort" and \
                    isinstance(raw_nodes[target], dict) and "pairs_with" in raw_nodes[target]:
                raise node_links.error(outlink, f"links to {target!r}, the worker's half of the claim pair, "
                                                f"which reads the uplink only")
        links[node_name] = dict(node_links.value)

    entry = top.get("input", str, next(iter(nodes)), check=lambda v: v in nodes,
                    why="must name a node of this flow (not the worker's half of the claim pair)")
    _refuse_cycles(links, top)
    cluster = parse_cluster(top, message, pair, {n: node.outlinks for n, node in nodes.items()}, links)
    return FlowGraph(name, entry, id_path, nodes, links, file, cluster.message if cluster else message, cluster, text)


def node_params(section: Params) -> Params:
    """A node's section as its builder sees it: every field but ``type`` and ``links``."""
    return Params(section.doc, section.path, {k: v for k, v in section.value.items() if k not in ("type", "links")})


def read_text(path: str | Path) -> str:
    """A flow file's text, or FlowFileError when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise FlowFileError(str(path), None, "(file)", f"cannot be read: {exc.strerror}") from None


def load_graph(path: str | Path) -> FlowGraph:
    """Read, validate and build a flow; FlowFileError names what is wrong and where.

    The flow file's folder goes on the import path first, so a handler or
    resolver can live next to the flow (``handler: "handlers:deliver"``).
    """
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return parse_graph(read_text(path), str(path))


def _refuse_cycles(links: dict[str, dict[str, str]], top: Params) -> None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for outlink, nxt in links.get(node, {}).items():
            if state.get(nxt) == 1:
                loop = " -> ".join(path + [nxt])
                raise top.doc.error(f"nodes.{node}.links.{outlink}", f"links form a cycle ({loop})")
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in links:
        if node not in state:
            visit(node, [node])


__all__ = ["FlowGraph", "FlowFileError", "node_params", "parse_graph", "load_graph"]
