"""``twinflow tail STREAM FLOW``: follow one of a flow's streams, one JSON line per entry.

``STREAM`` is a stream the flow writes, by its name (``sink``, ``out:<node>:<outlink>``,
``failure``, ``notices``), or an outlink's as ``<node>.<outlink>``, or the flow's uplink by its
``uplink.stream``. Each entry is printed as ``{"stream", "id", "fields"}`` (the fields as text).

Without ``--group`` it reads by entry ID (``XREAD BLOCK``): the entries added from now on, or
with ``--from-start`` every entry the stream holds first. It records nothing in Redis, so the
stream's retention cannot tell what it read. With ``--group G --consumer C`` it reads as that
consumer of the group (``XREADGROUP``) and acknowledges each entry once it is printed (``XACK``);
``--from-start`` then first prints the entries given to this consumer and never acknowledged.
The group must exist: ``tail`` never creates one, since a group nobody reads would count every
entry the retention removes as unread.

Under failure: an unknown stream ends the command before it connects, naming the streams it
knows (exit ``EXIT_BAD_FLOW``); a group that does not exist ends it with the ``XGROUP CREATE``
that makes it (exit 1); Redis that does not answer, ``EXIT_UNAVAILABLE``. Ctrl-C or SIGTERM
stop it cleanly within one ``BLOCK`` (half a second): an entry printed is acknowledged, and the
exit status is 0, as it is after ``--count`` entries.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

from twinflow.cli_common import EXIT_BAD_FLOW, EXIT_UNAVAILABLE, _address, _load_flow

BLOCK_MS = 500  # how long one read waits for an entry: the longest a stop waits
PAGE = 100      # entries one read takes at most


def stream_names(graph) -> dict[str, str]:
    """Each name ``tail`` takes for a stream of ``graph`` -> the stream's name under the flow's keys."""
    from twinflow.runtime.stream_spec import written_streams

    names = written_streams(graph.nodes, graph.links)
    names.setdefault(graph.cluster.uplink_stream, graph.cluster.uplink_stream)
    return names


def cmd_tail(args) -> int:
    import redis

    from twinflow.cluster.on_cluster import flow_keys
    from twinflow.runtime.shards import shard_graph
    from twinflow.runtime.store.redis_slot import client_from_url
    from twinflow.secrets import redact_text

    graph = _load_flow(args.flow)
    names = stream_names(graph)
    if args.stream not in names:
        known = ", ".join(sorted(set(names.values())))
        return _refuse(f"flow {graph.name!r} has no stream {args.stream!r} (its streams: {known}; an outlink's "
                       f"is also named <node>.<outlink>)")
    if (args.group is None) != (args.consumer is None):
        return _refuse("--group and --consumer go together (a consumer group reads as one of its consumers)")
    shards = graph.cluster.shards
    if shards > 1 and (args.shard is None or not 0 <= args.shard < shards):
        return _refuse(f"flow {graph.name!r} has {shards} uplink shards, each with streams of its own: pass "
                       f"--shard 0..{shards - 1}")
    if shards == 1 and args.shard not in (None, 0):
        return _refuse(f"flow {graph.name!r} has one uplink shard: --shard 0 or none")
    name = names[args.stream]
    keys = flow_keys(shard_graph(graph, args.shard or 0))
    key = keys.uplink if name == graph.cluster.uplink_stream else keys.stream(name)
    stop = threading.Event()
    before = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        client = client_from_url(_address(args.redis, "TWINFLOW_REDIS", "redis"), socket_connect_timeout=3,
                                 slot_key=key)
        follow = _by_group if args.group else _by_id
        follow(client, key, name, args, stop)
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        print(f"twinflow: stream {key} has no consumer group {args.group!r}; create it with XGROUP CREATE {key} "
              f"{args.group} $ (0 for the entries it holds already)", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"twinflow: Redis did not answer: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    return 0


def _refuse(reason: str) -> int:
    print(f"twinflow: {reason}", file=sys.stderr)
    return EXIT_BAD_FLOW


def _by_id(client, key: str, name: str, args, stop: threading.Event) -> None:
    """XREAD BLOCK from the stream's last entry, or from its first with ``--from-start``."""
    if args.from_start:
        after = "0-0"
    else:
        last = client.xrevrange(key, "+", "-", count=1)
        after = last[0][0].decode() if last else "0-0"
    left = args.count
    while not stop.is_set() and left != 0:
        reply = client.xread({key: after}, count=PAGE if left is None else min(PAGE, left), block=BLOCK_MS)
        for _, entries in reply or ():
            for entry_id, fields in entries:
                after = _print(name, entry_id, fields)
                left = None if left is None else left - 1


def _by_group(client, key: str, name: str, args, stop: threading.Event) -> None:
    """XREADGROUP as ``--consumer`` of ``--group``, each entry acknowledged once printed; with
    ``--from-start`` its own unacknowledged entries first."""
    left = args.count
    pending = bool(args.from_start)
    while not stop.is_set() and left != 0:
        want = PAGE if left is None else min(PAGE, left)
        reply = client.xreadgroup(args.group, args.consumer, {key: "0" if pending else ">"}, count=want,
                                  block=None if pending else BLOCK_MS)
        entries = [e for _, batch in reply or () for e in batch]
        if pending and not entries:
            pending = False  # every entry given to this consumer before is printed: now the new ones
            continue
        done = []
        for entry_id, fields in entries:
            _print(name, entry_id, fields)
            done.append(entry_id)
            left = None if left is None else left - 1
        if done:
            client.xack(key, args.group, *done)


def _print(name: str, entry_id: bytes, fields: dict | None) -> str:
    """One entry as a JSON line; ``fields`` null for an entry given to a consumer and removed (by the
    retention) before it was acknowledged: Redis returns it without fields, and an entry has at least one."""
    text = entry_id.decode()
    shown = None if not fields else {k.decode(errors="replace"): v.decode(errors="replace")
                                         for k, v in fields.items()}
    print(json.dumps({"stream": name, "id": text, "fields": shown}), flush=True)
    return text
