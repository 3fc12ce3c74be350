"""Waiting in Redis for a stream's next entry without fetching it: XREAD BLOCK, of whose reply
only the first line is read.

It holds ``_wait_for_entry``, which the Redis Stream reader (``source.py``) calls when a read
found nothing new. Under failure it raises the redis-py error that says what went wrong
(connection, time-out, LOADING, MOVED, CLUSTERDOWN...), for the reader to wait out or follow,
and drops the connection whenever the reply was not read whole, so no half-read reply is
left on a pooled connection.
"""

from __future__ import annotations

from typing import Any


def _wait_for_entry(client: Any, stream: str, after: str, block_ms: int) -> bool:
    """Block in Redis until the stream has an entry after ``after``; False after block_ms.

    XREAD's reply would carry the new entry whole, however big. Only the
    reply's first line is read here ("*-1": none came; "*1": one did); when an
    entry came, the connection is dropped with the rest of the reply unread,
    and the entry is then read through READ_BATCH like any other.
    """
    import socket

    import redis

    pool = client.connection_pool
    conn = pool.get_connection()
    clean = False
    try:
        conn.send_command("XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", stream, after)
        sock = conn._sock  # redis-py has no public call to read part of a reply
        sock.settimeout(block_ms / 1000 + (conn.socket_timeout or 10))
        received = b""
        try:
            while b"\r\n" not in received:
                chunk = sock.recv(256)
                if not chunk:
                    raise redis.ConnectionError("Redis closed the connection while waiting")
                received += chunk
        except socket.timeout as exc:
            raise redis.TimeoutError("timed out waiting for XREAD BLOCK to answer") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"waiting for new entries: {exc}") from exc
        line, _, rest = received.partition(b"\r\n")
        if line in (b"*-1", b"_"):  # RESP2 / RESP3 null: nothing came within block_ms
            clean = not rest
            return False
        if line.startswith(b"-"):
            clean = not rest
            message = line[1:].decode(errors="replace")
            if message.startswith("LOADING"):
                raise redis.BusyLoadingError(message)  # a ConnectionError: retried
            if message.startswith("MOVED "):  # the uplink's slot moved (a cluster failover): followed
                raise redis.exceptions.MovedError(message[len("MOVED "):])
            if message.startswith(("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN")):
                raise redis.exceptions.ClusterDownError(message)  # transient: retried
            raise redis.ResponseError(message)
        return True
    finally:
        if clean:
            conn._sock.settimeout(conn.socket_timeout)
        else:
            conn.disconnect()
        pool.release(conn)
