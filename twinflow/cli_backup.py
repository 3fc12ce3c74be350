"""``twinflow backup FLOW OUT`` and ``twinflow restore FLOW IN``: a flow's Redis state to a file and back.

``backup`` copies every key of the flow (each shard's) at one instant while the flow runs
(``cluster/flow_backup.py``: the Redis's writes wait for the copy, at most
``--max-pause-ms``) and writes the file atomically. ``restore`` puts a file's keys into a
Redis, the same or another, with a new fencing epoch from ZooKeeper
(``cluster/flow_restore.py``); the peers are then started on new state directories with
``--start-from processed``. Redis comes from ``--redis`` or ``TWINFLOW_REDIS`` (with the
password and TLS variables every command reads, Sentinel URLs included), ZooKeeper from
``--zk`` or ``TWINFLOW_ZK`` with ``TWINFLOW_ZK_AUTH``: a peer's environment file serves.

Under failure, one line on stderr and nothing written: ``EXIT_REFUSED`` when the command
refuses (a backup whose copy would outlast its pause, on a Redis that cannot pause, of a
flow being restored; a restore of a damaged file or one of another flow, while a peer
runs, or onto keys of the flow without ``--replace``, or into an older Redis);
``EXIT_UNAVAILABLE`` when Redis or ZooKeeper does not answer (a restore stopped part way
leaves its mark, so that no peer starts on half a state; run it again with ``--replace``);
``EXIT_BAD_FLOW`` for a flow file that cannot run on the cluster.
"""

from __future__ import annotations

import sys

from twinflow.cli_common import EXIT_REFUSED, EXIT_UNAVAILABLE, _address


def cmd_backup(args) -> int:
    import redis

    from twinflow.cli_peer import _flow_stores
    from twinflow.cluster.flow_backup import BackupRefused, take_backup
    from twinflow.cluster.flow_restore import iso
    from twinflow.secrets import redact_text

    graph, stores = _flow_stores(args)
    bound = args.max_pause_ms or max(1, int(graph.cluster.write_lease * 1000 / 2))
    try:
        header = take_backup(graph, stores, args.out, bound)
    except BackupRefused as exc:
        return _refused("backup", str(exc))
    except redis.RedisError as exc:
        print(f"twinflow: Redis did not answer: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    for s in header["shards"]:
        print(f"{s['flow']}: {s['keys']:,} keys copied at {iso(s['redis_time_ms'])} (Redis time) in a "
              f"{s['pause_ms']:.0f} ms pause of its writes; epoch {s['epoch']}, processed up to "
              f"{s['processed'] or 'none'}, uplink up to {s['uplink_last'] or 'none'}")
    print(f"wrote {args.out}: {header['keys']:,} keys, {header['bytes']:,} bytes, sha256 {header['sha256']}")
    return 0


def cmd_restore(args) -> int:
    import redis
    from kazoo.exceptions import KazooException

    from twinflow.cli_peer import _flow_stores
    from twinflow.cluster.connect import ServiceUnavailable, connect_zookeeper
    from twinflow.cluster.flow_restore import Restore, RestoreRefused
    from twinflow.cluster.zk_auth import ZkAccessDenied
    from twinflow.runtime.backup_file import BackupDamaged, read_backup
    from twinflow.runtime.store.store_errors import RedisUnavailable
    from twinflow.secrets import SecretError, redact_text

    graph, stores = _flow_stores(args)
    try:
        header, records = read_backup(args.file)
    except (BackupDamaged, OSError) as exc:
        return _refused("restore", str(exc))
    zk = None
    try:
        zk = connect_zookeeper(_address(args.zk, "TWINFLOW_ZK", "zk"), deadline_s=args.connect_timeout)
        restore = Restore(graph, stores, zk, header, records, file=args.file, replace=args.replace,
                          wait_stopped_s=args.wait_stopped)
        restore.check()
        done = restore.run()
    except (RestoreRefused, ZkAccessDenied, SecretError) as exc:
        return _refused("restore", str(exc))
    except ServiceUnavailable as exc:
        print(f"twinflow: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (redis.RedisError, RedisUnavailable, KazooException) as exc:
        print(f"twinflow: restore stopped: a server did not answer ({type(exc).__name__}: {redact_text(str(exc))}); "
              f"if it had begun, its mark keeps the peers from starting: run it again with --replace",
              file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        if zk is not None:
            zk.stop()
            zk.close()
    for d in done:
        print(f"{d['flow']}: restored {d['keys']:,} keys of the backup taken at {d['backup_time']} (Redis time; "
              f"{d['deleted']:,} keys there before deleted); fencing epoch {d['epoch']}; processed up to "
              f"{d['processed'] or 'none'}, uplink up to {d['uplink_last'] or 'none'}")
    print(f"next: start every peer on a new state directory with --start-from processed (TWINFLOW_START_FROM="
          f"processed), then resend every message acknowledged since {min(d['backup_time'] for d in done)} "
          f"(or earlier: the ID cache drops what the flow processed already)")
    return 0


def _refused(command: str, reason: str) -> int:
    print(f"twinflow: {command} refused: {reason}", file=sys.stderr)
    return EXIT_REFUSED
