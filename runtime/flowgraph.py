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
anything runs. :func:`check_graph` reads the same file by the same rules but
collects every refusal (``twinflow validate``): each node, each link and each
section is read on its own, and what depends on a refused part (a refused
node's links, a notice naming it) is left unchecked rather than refused twice.
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
from .params import NAME, Doc, FlowFileError, Params, Refusals
from .stream_spec import written_streams


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


TOP_FIELDS = ("flow", "input", "message", "nodes", "uplink", "cluster", "failure", "security", "audit", "notices",
              "streams")


def parse_graph(text: str, file: str = "<string>") -> FlowGraph:
    """The flow of ``text``; FlowFileError, with file, line, field and reason, at the first refusal."""
    graph = _parse(text, file, Refusals())
    assert graph is not None  # a refusal raised
    return graph


def check_graph(text: str, file: str = "<string>") -> tuple[FlowGraph | None, list[FlowFileError]]:
    """Every refusal of ``text`` at once (``twinflow validate``): the flow (None when any) and the
    refusals in the file's order of parts. Each node and each section is read on its own, with the
    same rules as :func:`parse_graph`; what depends on a refused part is not checked."""
    refusals = Refusals(collect=True)
    try:
        graph = _parse(text, file, refusals)
    except FlowFileError as exc:  # the file as a whole: not YAML, empty, not a mapping
        return None, [exc]
    return (None if refusals.found else graph), refusals.found


def _parse(text: str, file: str, r: Refusals) -> FlowGraph | None:
    doc = Doc(text, file)
    top = Params(doc, "", doc.value)
    for exc in top.unknown(*TOP_FIELDS):
        r.add(exc)
    name, message, id_path, raw_nodes = "", MessageSpec(), FieldPath("id"), {}
    with r.unit():
        name = top.name("flow")
    with r.unit():
        message = read_message(top)
        id_path = top.section("message", default={}).field_path("id", FieldPath("id"))
    with r.unit():
        raw_nodes = top.get("nodes", dict, check=bool, why="must define at least one node")

    nodes: dict[str, Node] = {}
    links: dict[str, dict[str, str]] = {}
    refused: set[str] = set()  # nodes refused (when collecting): what refers to them is not checked
    all_nodes = Params(doc, "nodes", raw_nodes)
    kinds = {k: v.get("type") if isinstance(v, dict) else None for k, v in raw_nodes.items()}
    pair = None
    for node_name in raw_nodes:
        n = None
        refused.add(node_name)
        with r.unit():
            if not NAME.fullmatch(str(node_name)):
                raise all_nodes.error(node_name, "a node name must be 1-64 letters, digits, '_', '-' or '.'")
            n = all_nodes.section(node_name)
            kind = n.choice("type", KINDS)
            if kind == "sort" and n.has("pairs_with"):
                if pair is not None:
                    raise n.error("pairs_with", f"node {pair.sort!r} already pairs with {pair.action!r} "
                                                f"(a flow has one claim pair)")
                pair = read_pair(n, kinds, message)
                refused.discard(node_name)
                continue
            nodes[node_name] = builder(kind)(node_name, node_params(n))
            refused.discard(node_name)
        if node_name in nodes:
            links[node_name] = _links(n, nodes[node_name], raw_nodes, kinds, pair, r)

    if not nodes and not refused and raw_nodes:
        r.add(top.error("nodes", "must define a node besides the worker's half of the claim pair"))
    entry = next(iter(nodes), "")
    with r.unit():
        entry = top.get("input", str, entry, check=lambda v: v in nodes or v in refused,
                        why="must name a node of this flow (not the worker's half of the claim pair)")
    with r.unit():
        _refuse_cycles(links, top)
    outlinks = {n: node.outlinks for n, node in nodes.items()}
    outlinks.update({n: None for n in refused})  # unknown: a refused node's outlinks are not checked against
    written = None if refused else written_streams(nodes, links)
    cluster = parse_cluster(top, message, pair, outlinks, links, r, written)
    return FlowGraph(name, entry, id_path, nodes, links, file, cluster.message if cluster else message, cluster, text)


def _links(n: Params, node: Node, raw_nodes: dict, kinds: dict, pair, r: Refusals) -> dict[str, str]:
    """A node's ``links``, each checked on its own: it must start at an outlink the node has and
    end at a node of the flow, never at the worker's half of the claim pair."""
    kept: dict[str, str] = {}
    with r.unit():
        node_links = n.section("links", default={})
        for outlink, target in node_links.value.items():
            with r.unit():
                if outlink not in node.outlinks:
                    raise node_links.error(outlink, f"{node.kind} has no outlink {outlink!r} "
                                                    f"(it has: {', '.join(node.outlinks)})")
                if not isinstance(target, str) or target not in raw_nodes:
                    raise node_links.error(outlink, f"links to {target!r}, which is not a node of this flow")
                if pair is not None and target == pair.sort or kinds.get(target) == "sort" and \
                        isinstance(raw_nodes[target], dict) and "pairs_with" in raw_nodes[target]:
                    raise node_links.error(outlink, f"links to {target!r}, the worker's half of the claim pair, "
                                                    f"which reads the uplink only")
                kept[outlink] = target
    return kept


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
    _import_path(path)
    return parse_graph(read_text(path), str(path))


def check_file(path: str | Path) -> tuple[FlowGraph | None, list[FlowFileError]]:
    """:func:`check_graph` of the file at ``path``, read as :func:`load_graph` reads it."""
    try:
        text = read_text(path)
    except FlowFileError as exc:
        return None, [exc]
    _import_path(path)
    return check_graph(text, str(path))


_FLOW_FOLDERS: set[Path] = set()  # every flow folder this process has put on the import path


def _import_path(path: str | Path) -> None:
    """The flow file's folder first on the import path, and its own modules the ones imported.

    A process that loads several flows (``validate`` of many files, the console, a test
    run) may hold a module of the same name from another flow's folder (two flows each
    with a ``handlers.py``): that cached module is forgotten, so ``handlers:deliver``
    names this folder's function, as ``twinflow run`` of the file alone would. Only
    modules imported from another flow's folder are forgotten, never a library's.
    """
    folder = Path(path).resolve().parent
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))
    _FLOW_FOLDERS.add(folder)
    for name in _modules_in(folder) & sys.modules.keys():
        origin = getattr(sys.modules[name], "__file__", None)
        if origin is None:
            continue
        home = Path(origin).resolve().parent
        home = home.parent if Path(origin).name == "__init__.py" else home
        if home != folder and home in _FLOW_FOLDERS:
            for cached in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
                del sys.modules[cached]


def _modules_in(folder: Path) -> set[str]:
    """The top-level modules and packages ``folder`` holds."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return set()
    return {e.stem for e in entries if e.suffix == ".py" and e.is_file()} | {
        e.name for e in entries if (e / "__init__.py").is_file()}


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


__all__ = ["FlowGraph", "FlowFileError", "check_graph", "check_file", "node_params", "parse_graph", "load_graph"]
