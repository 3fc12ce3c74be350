"""The ``twinflow`` commands that run and inspect a peer: ``run``, ``status``, ``handover``.

Under failure: a peer that cannot start ends with ``EXIT_REFUSED`` (a start that could
break a promise) or ``EXIT_UNAVAILABLE`` (a server not reachable by the deadline), the
reason on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from twinflow.cli_common import (EXIT_REFUSED, EXIT_UNAVAILABLE, START_FROM, _address, _grpc_failure, _grpc_security,
                                 _load_flow, _operator_settings, _spark_conf, _table)

STATUS_COLUMNS = ["peer_id", "role", "epoch", "uplink_lag", "baked", "claimed", "rolled_back",
                  "delivered", "failed", "unclaimed", "backpressure", "suspended", "redis", "grpc_address", "rule_pending"]
# The peers `twinflow status` last found in Redis, asked over gRPC when Redis does not answer:
# kept in the operator's cache directory (peers_seen_path), never the current directory.
PEERS_SEEN = "peers-{flow}.json"


def peers_seen_path(flow: str) -> Path:
    """Where ``twinflow status`` keeps the peers it last found for ``flow``: ``TWINFLOW_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/twinflow``, else ``~/.cache/twinflow``.

    >>> str(peers_seen_path("orders")).endswith("peers-orders.json")
    True
    """
    base = os.environ.get("TWINFLOW_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "twinflow") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "twinflow")
    return Path(base) / PEERS_SEEN.format(flow=flow)


def _remember_peers(seen: Path, addresses: list[str]) -> None:
    """Write the peers found to ``seen``; a cache that cannot be written is one line on stderr."""
    try:
        seen.parent.mkdir(parents=True, exist_ok=True)
        tmp = seen.with_name(seen.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(addresses))
        os.replace(tmp, seen)
    except OSError as exc:
        print(f"twinflow: warning: could not keep the peers found in {seen} ({exc.strerror or exc}); set "
              f"TWINFLOW_CACHE_DIR to a writable directory", file=sys.stderr)


def _peers_remembered(seen: Path) -> list[str]:
    try:
        found = json.loads(seen.read_text())
        return [a for a in found if isinstance(a, str)] if isinstance(found, list) else []
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        print(f"twinflow: warning: could not read the peers last found from {seen} ({exc})", file=sys.stderr)
        return []


def cmd_run(args) -> int:
    if not args.peer_id:  # not argparse's required=: --node-id (the same flag) may give it
        print("twinflow run: the following arguments are required: --peer-id", file=sys.stderr)
        return 2
    # The peer's only fork is Spark's JVM launch, an immediate exec: gRPC's
    # fork handlers have nothing to protect there and can break it.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from twinflow.cluster.connect import ServiceUnavailable
    from twinflow.cluster.peer import Peer
    from twinflow.cluster.peer_config import PeerConfig
    from twinflow.cluster.real_parts import RealParts
    from twinflow.cluster.on_cluster import StartRefused
    from twinflow.grpc_security import SecurityConfigError
    from twinflow.cluster.zk_auth import ZkAccessDenied
    from twinflow.runtime.store.redis_auth import RedisSettingsError
    from twinflow.secrets import SecretError

    if args.start_from is not None and args.start_from not in START_FROM:  # argparse checks the flag, not its variable
        print(f"twinflow run: TWINFLOW_START_FROM={args.start_from!r}: must be one of {', '.join(START_FROM)}",
              file=sys.stderr)
        return 2
    graph = _load_flow(args.flow)
    cfg = PeerConfig(
        peer_id=args.peer_id,
        redis_url=_address(args.redis, "TWINFLOW_REDIS", "redis"),
        zk_hosts=_address(args.zk, "TWINFLOW_ZK", "zk"),
        listen=args.listen,
        advertise=args.advertise,
        spark_master=args.spark_master or os.environ.get("TWINFLOW_SPARK_MASTER", "local[1]"),
        spark_conf=_spark_conf(args.spark_conf),
        state_dir=args.state_dir,
        connect_deadline_s=args.connect_timeout,
        start_from=args.start_from,
        worker_pace_ms=args.worker_pace_ms,
        worker_read_behind_ms=args.worker_read_behind_ms,
        security=_grpc_security(args, graph),
        metrics_listen=args.metrics_listen,
        console_listen=args.console_listen,
        console_hosts=tuple(getattr(args, "console_allow_host", None) or ()),
        batch_log=args.batch_log.replace("{peer}", args.peer_id) if args.batch_log else None,
    )
    try:  # before anything starts: a refused bind must not wait for Spark to come up first
        cfg.security.check_bind(cfg.listen)
    except SecurityConfigError as exc:
        print(f"twinflow: refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        peer = Peer.for_flow(graph, cfg, parts=RealParts())
    except StartRefused as exc:  # a flow that cannot run on the cluster
        print(f"twinflow: refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    signal.signal(signal.SIGTERM, lambda *_: peer.request_term())
    try:
        return peer.run_forever()
    except ServiceUnavailable as exc:
        print(f"twinflow: {exc}", file=sys.stderr)
        peer.stop()
        return EXIT_UNAVAILABLE
    except (StartRefused, SecurityConfigError, RedisSettingsError, SecretError, ZkAccessDenied) as exc:
        print(f"twinflow: refused to start: {exc}", file=sys.stderr)
        peer.stop()
        return EXIT_REFUSED
    except KeyboardInterrupt:
        peer.stop()
        return 130


def _flow_stores(args):
    """The flow and one store per uplink shard (one for an unsharded flow)."""
    from twinflow.cluster.operator_stores import operator_stores

    graph = _load_flow(args.flow)
    return graph, operator_stores(graph, _address(args.redis, "TWINFLOW_REDIS", "redis"))


def cmd_status(args) -> int:
    import redis

    from twinflow.runtime.store.store_errors import RedisUnavailable
    from twinflow.secrets import redact_text, redact_url

    _operator_settings(args)  # half a certificate pair is refused even when Redis answers
    if args.grpc:
        return _status_over_grpc(args)
    graph, stores = _flow_stores(args)
    if args.wait_streaming and not _wait_streaming(stores, args.wait_streaming, args.wait_timeout):
        print(f"twinflow: peer {args.wait_streaming} of flow {graph.name} did not stream within "
              f"{args.wait_timeout:g} s", file=sys.stderr)
        return 1
    seen = peers_seen_path(graph.name)
    try:
        rows = []
        for shard in stores:  # a sharded flow: a row per peer and shard
            for row in shard.read_statuses(deadline_s=3.0):
                # The live lag, not the one cached in the status hash.
                row["uplink_lag"], row["uplink_lag_s"] = shard.uplink_behind(row["peer_id"])
                rows.append(row)
        _remember_peers(seen, sorted({r["grpc_address"] for r in rows if r.get("grpc_address")}))
    except (redis.RedisError, RedisUnavailable) as exc:
        # Redis is down: ask the peers themselves (they report it, and whether they read).
        print(f"twinflow: Redis at {redact_url(_address(args.redis, 'TWINFLOW_REDIS', 'redis'))} did not answer: "
              f"{redact_text(str(exc))}", file=sys.stderr)
        rows = _statuses_over_grpc(args.peer or _peers_remembered(seen),
                                   _grpc_security(args, graph))
        if not rows:
            print("twinflow: no peer answered over gRPC either (pass --peer HOST:PORT)", file=sys.stderr)
            return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps({"flow": graph.name, "peers": rows, "nodes": rows}))  # "nodes": the same rows, for scripts that read it
        return 0
    if not rows:
        print(f"flow {graph.name}: no live peers")
        return 0
    columns = STATUS_COLUMNS if len(stores) == 1 else ["flow", *STATUS_COLUMNS]
    print(_table(columns, [[_cell(r.get(c, "")) for c in columns] for r in rows]))
    return 0


def _wait_streaming(stores, peer_id: str, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Whether peer ``peer_id`` streams in every shard before ``timeout_s`` passes. A peer drops
    its status when it stops, so a restarted peer counts once its new process streams; Redis
    not answering counts as not yet."""
    import redis

    from twinflow.runtime.store.store_errors import RedisUnavailable

    end = time.monotonic() + timeout_s
    while True:
        try:
            rows = [{r["peer_id"]: r for r in shard.read_statuses(deadline_s=3.0)}.get(peer_id, {})
                    for shard in stores]
            if all(row.get("streaming") == "1" for row in rows):
                return True
        except (redis.RedisError, RedisUnavailable):
            pass
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)


def _cell(value) -> str:
    """A status value as a table shows it; RULE_PEND (a mapping) as ``ruleset=count ...``."""
    if isinstance(value, dict):  # RULE_PEND; or the suspensions, node -> record: their nodes
        return " ".join(k if isinstance(v, dict) else f"{k}={v}" for k, v in value.items()) or "-"
    return value


def _status_over_grpc(args) -> int:
    """``status --grpc``: each ``--peer`` asked over gRPC alone, so that a certificate or token the
    peers refuse shows (a rotation's check); EXIT_UNAVAILABLE unless every one answered."""
    if not args.peer:
        print("twinflow: status --grpc needs --peer HOST:PORT (each peer to ask)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    graph = _load_flow(args.flow)
    rows = _statuses_over_grpc(args.peer, _grpc_security(args, graph))
    if args.json:
        print(json.dumps({"flow": graph.name, "peers": rows, "nodes": rows}))
    elif rows:
        print(_table(STATUS_COLUMNS, [[_cell(r.get(c, "")) for c in STATUS_COLUMNS] for r in rows]))
    return 0 if len(rows) == len(args.peer) else EXIT_UNAVAILABLE


def _statuses_over_grpc(addresses: list[str], security) -> list[dict]:
    from twinflow.client import peer_status

    rows = []
    for address in addresses:
        try:
            rows.append(peer_status(address, timeout_s=3.0, security=security))
        except Exception as exc:  # a peer that is gone or refuses: say so, ask the next
            print(_grpc_failure(address, exc, security), file=sys.stderr)
    return rows


def cmd_handover(args) -> int:
    graph, stores = _flow_stores(args)
    security = _grpc_security(args, graph)  # first: it sets the gRPC core's log level, then imports gRPC
    from twinflow.cluster.handover_request import ask_masters

    asked = ask_masters(stores, security, args.timeout)
    if not asked:
        print("twinflow: no live master found", file=sys.stderr)
        return 1
    for one in asked:
        if one.error is not None:
            print(_grpc_failure(one.address, one.error, security), file=sys.stderr)
        else:
            print(json.dumps(one.reply))
    if any(one.error is not None for one in asked):
        return EXIT_UNAVAILABLE
    return 0 if all(one.reply.get("ok") for one in asked) else 1
