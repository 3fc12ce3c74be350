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

A primary that crashes gives no MOVED, only connection errors, until its
replica is promoted. A client built by :func:`client_from_url` carries a
:class:`ClusterLocator`: on a connection error the caller asks it
(:func:`relocate`), and it asks the URL's node and every cluster node seen so
far (primaries and replicas, from ``CLUSTER SLOTS``) who owns the slot now,
and moves there once one of them names a live owner.

Redis Sentinel: a ``redis+sentinel://`` URL (``rediss+sentinel://`` for TLS)
names the Sentinels and the service, see :func:`parse_sentinel_url`; the
client is redis-py's ``Sentinel(...).master_for(service)``, whose connections
ask the Sentinels for the primary's address each time they connect, so after
a connection error (or a READONLY reply from a demoted primary) the next
attempt goes to whichever primary the Sentinels name then.

Credentials and TLS: every client is built by :func:`client_from_url`, which
adds the password and TLS files the environment names (``redis_auth``), and
a client that follows MOVED keeps them (user, password, TLS files and the
connection class), so every node of a cluster must accept the same ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote

import redis

from .redis_auth import RedisSettingsError, client_options, sentinel_options

log = logging.getLogger("twinflow.store")

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
PROBE_TIMEOUT_S = 1.0   # at most this long to reach one cluster node while looking for a slot's owner


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelUrl:
    """What a ``redis+sentinel://`` URL names (see :func:`parse_sentinel_url`)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False


def parse_sentinel_url(url: str) -> SentinelUrl:
    """``redis+sentinel://[user[:password]@]host:port[,host:port...]/service[/db]``.

    ``rediss+sentinel://`` speaks TLS to the Sentinels and to the primary. The
    service may also be given as ``?service_name=`` (or ``master_name=``) with the
    path then naming only the database (``/0``), as redis-py users write it for
    ``Sentinel(...).master_for(service_name)``. A port defaults to 26379.

    >>> parse_sentinel_url("redis+sentinel://h1:26379,h2/mymaster/2")
    SentinelUrl(sentinels=(('h1', 26379), ('h2', 26379)), service='mymaster', db=2, username=None, password=None, tls=False)
    >>> parse_sentinel_url("rediss+sentinel://app:pw@h1:5000/0?service_name=mymaster").service
    'mymaster'
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise RedisSettingsError(f"not a redis+sentinel:// URL: {url.split('@')[-1]}")
    netloc, _, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    sentinels = []
    for part in hosts.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):  # [::1]:26379
            host, _, port = part[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
        try:
            sentinels.append((host, int(port or 26379)))
        except ValueError:
            raise RedisSettingsError(f"the Sentinel address {part!r} has no valid port") from None
    if not sentinels:
        raise RedisSettingsError("a redis+sentinel:// URL names at least one Sentinel (host:port)")
    path, _, query = tail.partition("?")
    params = parse_qs(query)
    segments = [unquote(p) for p in path.split("/") if p]
    service = (params.get("service_name") or params.get("master_name") or [None])[0]
    if service is None:
        if not segments:
            raise RedisSettingsError("a redis+sentinel:// URL names its service: redis+sentinel://host:26379/mymaster")
        service, segments = segments[0], segments[1:]
    db = 0
    if segments:
        try:
            db = int(segments[0])
        except ValueError:
            raise RedisSettingsError(f"the database in a redis+sentinel:// URL is a number, not {segments[0]!r}") \
                from None
    if params.get("db"):
        db = int(params["db"][0])
    return SentinelUrl(tuple(sentinels), service, db, username, password, scheme.lower() == "rediss+sentinel")


def sentinel_client(url: str, **options: Any) -> redis.Redis:
    """The primary of the service a ``redis+sentinel://`` URL names, as redis-py's ``master_for`` gives it.

    ``options`` (timeouts, retry, decode_responses, a password...) apply to the
    connections to the primary; the Sentinels get the same timeouts and TLS
    files, and the password ``sentinel_options`` finds (see redis_auth).
    """
    from redis.sentinel import Sentinel

    parsed = parse_sentinel_url(url)
    kwargs: dict[str, Any] = {**client_options(url), **options}
    kwargs.setdefault("db", parsed.db)
    if parsed.username:
        kwargs.setdefault("username", parsed.username)
    if parsed.password is not None:
        kwargs["password"] = parsed.password
    if parsed.tls:
        kwargs["ssl"] = True
    on_sentinels = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k.startswith("ssl")}
    on_sentinels.update(sentinel_options(url))
    retry = kwargs.get("retry")
    if retry is not None:
        on_sentinels["retry"] = retry
    manager = Sentinel(list(parsed.sentinels), sentinel_kwargs=on_sentinels, **kwargs)
    client = manager.master_for(parsed.service, **kwargs)
    client._twinflow_locator = SentinelLocator(parsed.service)  # noqa: SLF001 (see relocate)
    return client


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A client for ``url``; to a cluster node, one for the owner of ``slot_key``'s slot (see module).

    The environment's password and TLS files (``redis_auth``) come first, so that
    a caller's explicit ``options`` override them; a password in ``url`` overrides both.
    A ``redis+sentinel://`` URL gives the Sentinels' primary (``slot_key`` is not used).
    """
    slot_key = options.pop("slot_key", None)
    if is_sentinel_url(url):
        return sentinel_client(url, **options)
    client = redis.Redis.from_url(url, **{**client_options(url), **options})
    if slot_key is None:
        return client
    kw = client.connection_pool.connection_kwargs
    locator = ClusterLocator(slot_key, [(kw.get("host", "127.0.0.1"), int(kw.get("port", 6379)))])
    owner = slot_owner(client, slot_key, locator)
    if owner is not None:
        client = _to(client, *owner)
    client._twinflow_locator = locator  # noqa: SLF001 (see relocate)
    return client


@dataclass
class SentinelLocator:
    """A Sentinel-managed client finds its primary by itself (each new connection asks the
    Sentinels); nothing to do here."""

    service: str

    def relocate(self, client: redis.Redis) -> redis.Redis:
        return client


@dataclass
class ClusterLocator:
    """Where a flow's slot lives: the nodes to ask (``seeds``: the URL's; ``known``: every
    cluster node seen in ``CLUSTER SLOTS``), and :meth:`relocate` to move a client there."""

    slot_key: str
    seeds: list[tuple[str, int]]
    known: list[tuple[str, int]] = field(default_factory=list)

    def learn(self, slots: list) -> None:
        for _, _, *nodes in slots:
            for node in nodes:
                host = node[0].decode() if isinstance(node[0], bytes) else node[0]
                addr = (host or "127.0.0.1", int(node[1]))
                if addr not in self.known:
                    self.known.append(addr)

    def relocate(self, client: redis.Redis) -> redis.Redis:
        """``client``, or one like it on the node that owns the slot now, as the first cluster
        node that answers says (the current node is not asked: it failed just now)."""
        kw = client.connection_pool.connection_kwargs
        current = (kw.get("host"), kw.get("port"))
        ask = [a for a in dict.fromkeys([*self.seeds, *self.known]) if a != current]
        for host, port in ask:
            probe = redis.Redis(connection_pool=redis.ConnectionPool(
                connection_class=client.connection_pool.connection_class,
                **{**kw, "host": host, "port": port,
                   "socket_connect_timeout": min(PROBE_TIMEOUT_S, kw.get("socket_connect_timeout") or PROBE_TIMEOUT_S),
                   "socket_timeout": min(PROBE_TIMEOUT_S, kw.get("socket_timeout") or PROBE_TIMEOUT_S)}))
            try:
                owner = slot_owner(probe, self.slot_key, self)
            except redis.RedisError:
                continue
            finally:
                probe.close()
            if owner is None:  # not a cluster node: nothing to find
                return client
            if owner != current:
                log.warning("the flow's slot is served by %s:%s now (asked %s:%s); reconnecting",
                            owner[0], owner[1], host, port)
                return _to(client, *owner)
            return client
        return client


def relocate(client: redis.Redis) -> redis.Redis:
    """After a connection error: ``client``, or a client on the primary that serves the flow now
    (a Redis Cluster's slot owner, asked of every node known). Sentinel-managed and plain clients
    come back as they are (a Sentinel-managed one asks the Sentinels when it reconnects)."""
    locator = getattr(client, "_twinflow_locator", None)
    if locator is None:
        return client
    moved = locator.relocate(client)
    if moved is not client:
        moved._twinflow_locator = locator  # noqa: SLF001
    return moved


def slot_owner(client: redis.Redis, key: str, locator: ClusterLocator | None = None) -> tuple[str, int] | None:
    """(host, port) of the primary that owns ``key``'s slot, or None when ``client`` is not a cluster node;
    ``locator`` learns every node ``CLUSTER SLOTS`` names."""
    try:
        info = client.info("cluster")
    except redis.ResponseError:  # INFO refused (a managed Redis): not a cluster node we can ask
        return None
    if not int(info.get("cluster_enabled", 0)):
        return None
    slot = int(client.execute_command("CLUSTER KEYSLOT", key))
    slots = client.execute_command("CLUSTER SLOTS")
    if locator is not None:
        locator.learn(slots)
    for first, last, primary, *_ in slots:
        if int(first) <= slot <= int(last):
            host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
            return host or client.connection_pool.connection_kwargs.get("host", "127.0.0.1"), int(primary[1])
    raise redis.exceptions.ClusterDownError(f"CLUSTERDOWN no node serves slot {slot} (of key {key!r})")


def follow_moved(client: redis.Redis, moved: redis.exceptions.MovedError) -> redis.Redis:
    """A client like ``client`` on the node a MOVED reply names."""
    locator = getattr(client, "_twinflow_locator", None)
    out = _to(client, moved.host, moved.port)
    if locator is not None:
        out._twinflow_locator = locator  # noqa: SLF001
    return out


def _to(client: redis.Redis, host: str, port: int) -> redis.Redis:
    """A client with ``client``'s settings (timeouts, user, password, TLS, database) on another node."""
    pool = client.connection_pool
    if (pool.connection_kwargs.get("host"), pool.connection_kwargs.get("port")) == (host, port):
        return client
    moved = redis.ConnectionPool(connection_class=pool.connection_class,
                                 **{**pool.connection_kwargs, "host": host, "port": port})
    client.close()
    return redis.Redis(connection_pool=moved)
