"""``twinflow resume``: end a flow's suspensions now, rather than when their ``suspend_for`` is up.

An action node with ``on_retry_failure: suspend`` suspends the flow when a
message's retries are used up; every peer stops reading until the time is
up or an operator resumes it. The command writes a request naming each
suspension it ends (``runtime/store/suspensions.py``); the master resumes
them at its next timer round, starting with the suspended message.

Under failure: a flow that is not suspended is reported and nothing is
written (exit 0: there is nothing to do); Redis that does not answer ends the
command with ``EXIT_UNAVAILABLE``, nothing written.
"""

from __future__ import annotations

import getpass
import sys

from twinflow.cli_common import EXIT_UNAVAILABLE


def cmd_resume(args) -> int:
    import redis

    from twinflow.cli_peer import _flow_stores
    from twinflow.runtime.store.store_errors import RedisUnavailable
    from twinflow.secrets import redact_text

    graph, stores = _flow_stores(args)
    by = args.by or getpass.getuser()
    resumed = 0
    for store in stores:  # a sharded flow: each shard's suspensions
        try:
            held = store.request_resume(by, deadline_s=5.0)
        except (redis.RedisError, RedisUnavailable) as exc:
            print(f"twinflow: Redis did not answer: {redact_text(str(exc))}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        for node, s in held.items():
            print(f"{store.keys.flow}: resuming node {node} (suspended on message {s['id']!r} since "
                  f"{s['since']:.3f}: {s['reason']})")
            resumed += 1
    if not resumed:
        print(f"flow {graph.name} is not suspended: nothing to resume")
    return 0
