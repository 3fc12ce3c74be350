"""``twinflow validate FLOW [FLOW...]``: every refusal of each flow file at once, before anything runs.

Each file is read as ``twinflow run`` reads it (``runtime/flowgraph.py``), but with its nodes
and sections checked each on its own, so one pass lists every refusal, each with file, line,
field and reason; then, for a file that loads, the checks ``twinflow run`` applies before it
starts (``cluster/on_cluster.py``: an uplink section, nodes that can keep their state in Redis).
``--replay`` checks a flow meant for ``twinflow replay`` only, without those. Nothing touches a
server.

Output: one line per refusal, ``FILE:LINE: FIELD: REASON``, then a one-line summary; ``--json``
prints one JSON object instead (``ok``, ``files``, ``errors``: each ``file``, ``line`` (null when
the whole file is meant), ``field``, ``reason``).

Under failure: a file that cannot be read, is not YAML or is not a mapping is one refusal of its
own, and the other files are still checked. The exit status is 0 when no file has a refusal,
``EXIT_BAD_FLOW`` otherwise.
"""

from __future__ import annotations

import json

from twinflow.cli_common import EXIT_BAD_FLOW


def refusals_of(path: str, replay: bool = False) -> list:
    """Every refusal of the flow file at ``path`` (FlowFileError each), with those of the cluster's
    start checks (unless ``replay``), in the order of their lines."""
    from twinflow.cluster.on_cluster import cluster_refusals
    from twinflow.runtime.flowgraph import check_file
    from twinflow.runtime.params import Doc

    graph, found = check_file(path)
    if graph is not None and not replay:
        doc = Doc(graph.text, graph.source)  # the lines of the fields the start checks name
        found += [doc.error(field, reason) for field, reason in cluster_refusals(graph)]
    return sorted(found, key=lambda e: e.line or 0)


def cmd_validate(args) -> int:
    files = {path: refusals_of(path, args.replay) for path in args.flows}
    errors = [e for found in files.values() for e in found]
    bad = sum(1 for found in files.values() if found)
    if args.json:
        print(json.dumps({"ok": not errors, "files": len(files),
                          "errors": [{"file": e.file, "line": e.line, "field": e.field, "reason": e.reason}
                                     for e in errors]}))
    else:
        for e in errors:
            print(e)
        n = len(files)
        some = f"{n} flow file{'s' if n != 1 else ''}"
        if errors:
            print(f"{len(errors)} refusal{'s' if len(errors) != 1 else ''} in {bad} of {some}")
        else:
            print(f"ok: {some}, no refusals" + (" (checked for replay)" if args.replay else ""))
    return EXIT_BAD_FLOW if errors else 0
