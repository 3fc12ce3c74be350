"""What the ``twinflow`` commands share: addresses from flags, the environment or the local
services, flow files, Spark and gRPC settings, tables, and the exit codes.

Under failure: a flow file that cannot be read or parsed ends the command with
``EXIT_BAD_FLOW`` and the field and reason on stderr; a missing optional extra names
the ``pip install`` that adds it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SERVICES_STATE = Path(".twinflow") / "services.json"
LAB_DIR = Path(".twinflow") / "lab"

EXIT_BAD_FLOW = 2
EXIT_UNAVAILABLE = 3
EXIT_REFUSED = 4


def _local_services():
    from twinflow.testing.services import LocalServices

    return LocalServices.load(SERVICES_STATE) if SERVICES_STATE.exists() else None


def _address(flag: str | None, env: str, kind: str) -> str:
    if flag:
        return flag
    if os.environ.get(env):
        return os.environ[env]
    svc = _local_services()
    if svc is not None:
        return svc.redis_url if kind == "redis" else svc.zk_hosts
    raise SystemExit(f"twinflow: no {kind} address: pass --{kind}, set {env}, or run `twinflow services up`")


def _load_flow(path: str, cluster: bool = True):
    """The flow graph, or exit EXIT_BAD_FLOW naming what is wrong; ``cluster``: it must run on the cluster."""
    from twinflow.runtime.flowgraph import FlowFileError, load_graph

    try:
        graph = load_graph(path)
    except FlowFileError as exc:
        print(f"twinflow: flow file refused: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_FLOW) from None
    if cluster:
        from twinflow.cluster.on_cluster import StartRefused, cluster_flow

        try:
            cluster_flow(graph)
        except StartRefused as exc:
            print(f"twinflow: flow file refused: {exc}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_FLOW) from None
    return graph


def _spark_conf(pairs: list[str]) -> dict:
    conf = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.startswith("spark."):
            raise SystemExit(f"twinflow: --spark-conf {pair!r}: expected spark.KEY=VALUE")
        conf[key] = value
    return conf


def _grpc_security(args, graph):
    """The flow file's ``security`` section with the command line's TLS and token settings over it;
    exits EXIT_BAD_FLOW naming the file or setting that cannot be used (never a secret's value)."""
    from twinflow.grpc_security import SecurityConfigError, security_from
    from twinflow.secrets import SecretError

    refs = {}
    for pair in getattr(args, "token", None) or []:
        scope, eq, ref = pair.partition("=")
        if not eq:
            raise SystemExit(f"twinflow: --token {scope[:12]}...: expected SCOPE=file:PATH or SCOPE=env:NAME")
        refs[scope] = ref
    try:
        return security_from(graph.cluster.security if graph.cluster else None, cert=getattr(args, "tls_cert", None),
                             key=getattr(args, "tls_key", None), ca=args.tls_ca, mutual=getattr(args, "tls_mutual", False),
                             server_name=args.tls_server_name, token_refs=refs,
                             insecure=getattr(args, "insecure", False))
    except (SecurityConfigError, SecretError) as exc:
        print(f"twinflow: gRPC security settings refused: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_FLOW) from None


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- drill -------------------------------------------------------------------
def _need_extra(extra: str, *modules: str) -> None:
    """Exit EXIT_UNAVAILABLE naming the extra to install when one of ``modules`` is missing: the
    chaos tools' dependencies are not a peer's (``pip install 'twinflow[chaos]'``)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"twinflow: this command needs {', '.join(missing)}: pip install 'twinflow[{extra}]'", file=sys.stderr)
        raise SystemExit(EXIT_UNAVAILABLE)
