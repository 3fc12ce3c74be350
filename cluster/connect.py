"""Connecting to Redis and ZooKeeper, waiting with a deadline when they are down; a member's store.

A peer that starts while Redis or ZooKeeper is down says which server and
which address it is trying, retries with a bounded back-off, and gives up with
:class:`ServiceUnavailable` when its deadline passes, so that a supervisor sees
one clear failure instead of a crash loop. ``sleep`` and ``monotonic`` are
injected so that the waiting is testable without waiting. :func:`open_store`
opens a flow's (or a shard's) store on the Redis that owns its slot, waiting
the same way.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

from ..logs import event
from ..runtime.cluster_spec import ClusterSpec
from ..runtime.store.flow_keys import FlowKeys
from ..runtime.store.flow_store import FlowStore
from ..runtime.waiting import Backoff, retry

log = logging.getLogger("twinflow.connect")

T = TypeVar("T")


class ServiceUnavailable(RuntimeError):
    """A server did not answer before the deadline."""

    def __init__(self, service: str, where: str, waited_s: float, last_error: BaseException | None):
        self.service, self.where, self.waited_s, self.last_error = service, where, waited_s, last_error
        super().__init__(
            f"{service} at {where} did not answer within {waited_s:.1f} s (last error: {last_error})"
        )


def wait_for_service(
    service: str,
    where: str,
    attempt: Callable[[], T],
    deadline_s: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    max_backoff_s: float = 2.0,
) -> T:
    """Call ``attempt`` until it returns, logging each failure, up to ``deadline_s``."""

    def say(exc: BaseException, waited: float, pause: float) -> None:
        # One line per try (with back-off): at start-up, before the peer has a flow or an epoch.
        event(log, logging.WARNING, "service_waiting", "waiting for %s at %s: %s (giving up in %.0f s)", service,
              where, exc, deadline_s - waited, service=service, where=where, error=str(exc),
              seconds_left=round(deadline_s - waited, 1))

    return retry(attempt, retryable=lambda exc: True, deadline_s=deadline_s,
                 give_up=lambda exc, waited: ServiceUnavailable(service, where, waited, exc),
                 on_retry=say, sleep=sleep, monotonic=monotonic, backoff=Backoff(max_s=max_backoff_s))


def connect_redis(url: str, deadline_s: float, socket_timeout_s: float = 10.0, slot_key: str | None = None, **kw):
    """A redis-py client for ``url`` that has answered PING.

    ``socket_timeout_s`` bounds each call (and each connect): a master keeps
    it below its write lease so that a link that drops packets is noticed in time.
    With ``slot_key`` and a Redis Cluster, the client is on the primary that owns its slot.
    The password and TLS files may come from the environment (``store/redis_auth.py``);
    no log line or error shows a password, from the URL or from there.
    """
    from ..runtime.store.redis_auth import client_options, connect_error
    from ..secrets import redact_url
    from ..runtime.store.redis_slot import client_from_url

    # Settings that cannot work (an unreadable password file, TLS files with a
    # redis:// URL) raise now: waiting until the deadline would not fix them.
    options = client_options(url)

    def ping():
        try:
            # On a Redis Cluster, the primary that owns ``slot_key``'s slot (see store/redis_slot.py).
            client = client_from_url(url, socket_connect_timeout=min(2.0, socket_timeout_s),
                                     socket_timeout=socket_timeout_s, slot_key=slot_key)
            client.ping()
            return client
        except Exception as exc:
            # Logged on every retry and kept as ServiceUnavailable.last_error: take
            # out any password a redis-py or URL-parsing error might echo.
            raise connect_error(exc, url, options) from None

    return wait_for_service("Redis", redact_url(url), ping, deadline_s, **kw)


def connect_zookeeper(hosts: str, deadline_s: float, session_timeout_s: float = 2.0,
                      auth_ref: str | None = None, **kw):
    """A started kazoo client for ``hosts`` (a connect string, several hosts allowed).

    Credentials come from ``auth_ref``, else from ``TWINFLOW_ZK_AUTH`` (a secret
    reference, ``file:PATH`` or ``env:NAME``, holding ``user:password``); with
    them the client authenticates (digest) and creates every znode readable and
    writable by that identity only (``cluster/zk_auth.py``). Logs and errors
    show ``user:***``.
    """
    from kazoo.client import KazooClient

    from .zk_auth import credentials_from

    # A secret that cannot be read raises now: waiting until the deadline would not fix it.
    creds = credentials_from(auth_ref)
    options = creds.client_kwargs() if creds else {}
    where = f"{hosts} as {creds.redacted}" if creds else hosts

    def start():
        client = KazooClient(hosts=hosts, timeout=session_timeout_s, **options)
        try:
            client.start(timeout=min(5.0, max(1.0, deadline_s)))
        except Exception:
            client.close()
            raise
        return client

    return wait_for_service("ZooKeeper", where, start, deadline_s, **kw)


def open_store(redis_url: str, connect_deadline_s: float, keys: FlowKeys, peer_id: str,
               spec: ClusterSpec) -> FlowStore:
    """A flow's (or a shard's) store for ``peer_id``, on the Redis that owns its slot."""
    # Each Redis call is bounded by the lease, so a link that drops packets
    # shows as failed writes in time for the master to step down.
    client = connect_redis(redis_url, connect_deadline_s, socket_timeout_s=max(0.5, spec.write_lease),
                           slot_key=keys.uplink)
    return FlowStore(client, keys, peer_id, id_ttl=spec.message.id_ttl)
