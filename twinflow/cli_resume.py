"""``twinflow resume``: end a flow's suspensions now, rather than when their ``suspend_for`` is up.

An action node with ``on_retry_failure: suspend`` suspends the flow when a
message's retries are used up; every peer stops reading until the time is
up or an operator resumes it. The command writes a request naming each
suspension it ends (``runtime/store/suspensions.py``), into Redis
(``--redis``) or through a peer's Admin service (``--peer``, with the
operator's TLS options); the master resumes them at its next timer round,
starting with the suspended message.

Under failure: a flow that is not suspended is reported and nothing is
written (exit 0: there is nothing to do); Redis that does not answer ends the
command with ``EXIT_UNAVAILABLE``, nothing written; so does a peer that refuses
or does not answer (the reason in one line).
"""

from __future__ import annotations

import getpass
import sys

from twinflow.cli_common import EXIT_UNAVAILABLE, _grpc_failure, _grpc_security, _load_flow


def cmd_resume(args) -> int:
    if args.peer:
        return _resume_over_grpc(args)
    import redis

    from twinflow.cli_peer import _flow_stores
    from twinflow.runtime.store.store_errors import RedisUnavailable
    from twinflow.secrets import redact_text

    graph, stores = _flow_stores(args)
    by = args.by or getpass.getuser()
    resumed = []
    for store in stores:  # a sharded flow: each shard's suspensions
        try:
            held = store.request_resume(by, deadline_s=5.0)
        except (redis.RedisError, RedisUnavailable) as exc:
            print(f"twinflow: Redis did not answer: {redact_text(str(exc))}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        resumed += [{"flow": store.keys.flow, "node": node, **s} for node, s in held.items()]
    return _said(graph.name, resumed)


def _resume_over_grpc(args) -> int:
    """Through a peer's Admin service (the first of ``--peer`` that answers), over the operator's TLS."""
    import grpc

    from twinflow.client import Client

    graph = _load_flow(args.flow, cluster=False)
    security = _grpc_security(args, graph)
    with Client(args.peer, graph.name, security) as client:
        try:
            resumed = client.resume(args.by or getpass.getuser())
        except grpc.RpcError as exc:
            print(f"twinflow: {_grpc_failure(', '.join(args.peer), exc, security)}", file=sys.stderr)
            return EXIT_UNAVAILABLE
    return _said(graph.name, resumed)


def _said(flow: str, resumed: list[dict]) -> int:
    for s in resumed:
        print(f"{s['flow']}: resuming node {s['node']} (suspended on message {s['id']!r} since "
              f"{s['since']:.3f}: {s['reason']})")
    if not resumed:
        print(f"flow {flow} is not suspended: nothing to resume")
    return 0
