"""A flow's Redis connection, on a single Redis or a Redis Cluster.

Every key of a flow carries the hash tag ``{<flow>}``, so on a Redis Cluster
all of a flow lives in one slot, on one primary. :func:`flow_client` connects
to the URL it is given and, when that Redis is a cluster node, to the
primary that owns the flow's slot instead: a plain connection there runs
every pipeline, script and ``WAIT`` of the flow exactly as on a single Redis
(a cluster-aware client would refuse multi-key commands in pipelines). Point
``--redis`` at any node of the cluster.

Under failure: when the slot moves (a failover promoted a replica, or an
operator resharded), the old primary answers ``MOVED <slot> <host:port>``;
:func:`follow_moved` gives the caller a connection to the new owner, and the
store retries the call there (a call that got MOVED did not run).

Credentials and TLS: every client is built by :func:`client_from_url`, which
adds the password and TLS files the environment names (``redis_auth``), and
a client that follows MOVED keeps them (user, password, TLS files and the
connection class), so every node of a cluster must accept the same ones.
"""

from __future__ import annotations

from typing import Any

import redis

from .redis_auth import client_options


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A client for ``url``; to a cluster node, one for the owner of ``slot_key``'s slot (see module).

    The environment's password and TLS files (``redis_auth``) come first, so that
    a caller's explicit ``options`` override them; a password in ``url`` overrides both.
    """
    slot_key = options.pop("slot_key", None)
    client = redis.Redis.from_url(url, **{**client_options(url), **options})
    if slot_key is None:
        return client
    owner = slot_owner(client, slot_key)
    if owner is None:
        return client
    return _to(client, *owner)


def slot_owner(client: redis.Redis, key: str) -> tuple[str, int] | None:
    """(host, port) of the primary that owns ``key``'s slot, or None when ``client`` is not a cluster node."""
    try:
        info = client.info("cluster")
    except redis.ResponseError:  # INFO refused (a managed Redis): not a cluster node we can ask
        return None
    if not int(info.get("cluster_enabled", 0)):
        return None
    slot = int(client.execute_command("CLUSTER KEYSLOT", key))
    for first, last, primary, *_ in client.execute_command("CLUSTER SLOTS"):
        if int(first) <= slot <= int(last):
            host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
            return host or client.connection_pool.connection_kwargs.get("host", "127.0.0.1"), int(primary[1])
    raise redis.exceptions.ClusterDownError(f"CLUSTERDOWN no node serves slot {slot} (of key {key!r})")


def follow_moved(client: redis.Redis, moved: redis.exceptions.MovedError) -> redis.Redis:
    """A client like ``client`` on the node a MOVED reply names."""
    return _to(client, moved.host, moved.port)


def _to(client: redis.Redis, host: str, port: int) -> redis.Redis:
    """A client with ``client``'s settings (timeouts, user, password, TLS, database) on another node."""
    pool = client.connection_pool
    if (pool.connection_kwargs.get("host"), pool.connection_kwargs.get("port")) == (host, port):
        return client
    moved = redis.ConnectionPool(connection_class=pool.connection_class,
                                 **{**pool.connection_kwargs, "host": host, "port": port})
    client.close()
    return redis.Redis(connection_pool=moved)
