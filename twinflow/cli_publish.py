"""``twinflow publish FLOW --peer HOST:PORT``: send messages into a flow's uplink through a peer.

The messages are JSON objects, one per line (:mod:`twinflow.runtime.json_lines`), read from
standard input (or from the files named with ``--file``); each is sent as its text, in order, through the peers' Ingest service
(:class:`twinflow.client.Client`: the first of ``--peer`` that answers, over the operator's TLS
options and the ``ingest`` token, flags over their ``TWINFLOW_*`` variables). Each line's
uplink position is printed once the peer acknowledged it: a printed line is in Redis.

Under failure: a line that is not a JSON object ends the command before anything is sent,
naming the line (exit ``EXIT_BAD_FLOW``); a peer that refuses or does not answer within
``--deadline`` ends it with ``EXIT_UNAVAILABLE`` and the reason in one line, after printing
the positions of what was acknowledged before. Sending again is safe: the flow's ID cache
takes each message ID once.
"""

from __future__ import annotations

import sys

from twinflow.cli_common import EXIT_BAD_FLOW, EXIT_UNAVAILABLE, _grpc_failure, _grpc_security, _load_flow


def cmd_publish(args) -> int:
    import grpc

    from twinflow.client import Client, PublishError

    from twinflow.runtime.json_lines import JsonLinesError, json_objects

    graph = _load_flow(args.flow, cluster=False)
    try:
        if args.file:
            docs = []
            for path in args.file:
                with open(path) as f:
                    docs += json_objects(f, path)
        else:
            docs = json_objects(sys.stdin, "stdin")
    except JsonLinesError as exc:
        print(f"twinflow: {exc}", file=sys.stderr)
        return EXIT_BAD_FLOW
    except OSError as exc:
        print(f"twinflow: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_FLOW
    security = _grpc_security(args, graph)
    with Client(args.peer, graph.name, security) as client:
        try:
            positions = client.publish(docs, deadline_s=args.deadline)
        except PublishError as exc:
            for p in exc.positions:
                print(p)
            print(f"twinflow: {_grpc_failure(', '.join(args.peer), exc, security)}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except grpc.RpcError as exc:
            print(f"twinflow: {_grpc_failure(', '.join(args.peer), exc, security)}", file=sys.stderr)
            return EXIT_UNAVAILABLE
    for p in positions:
        print(p)
    print(f"{len(positions)} messages written to flow {graph.name}'s uplink", file=sys.stderr)
    return 0
