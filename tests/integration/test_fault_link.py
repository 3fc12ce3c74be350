"""A FaultLink (one link through the fault proxy, with its cut toxic) against a real redis-server
(and a bare socket where bytes must be seen).

Clients are built with no retries and one connection each, so that what a
fault does to a call is what the call raises: redis-py would otherwise retry
or quietly swap in a fresh pooled connection.
"""

from __future__ import annotations

import socket
import threading
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from twinflow.chaos.fault_link import FaultLink
from twinflow.testing.servers import free_port
from tests.conftest import wait_until

TIMEOUT_S = 0.5


@pytest.fixture
def upstream(redis_url) -> tuple[str, int]:
    parts = urlsplit(redis_url)
    return parts.hostname, parts.port


@pytest.fixture
def proxy(upstream):
    p = FaultLink(upstream).start()
    yield p
    assert p.stop()


@pytest.fixture
def connect():
    """Build clients on a proxy's port; close them all at the end."""
    made: list[redis.Redis] = []

    def make(port: int) -> redis.Redis:
        made.append(redis.Redis(
            host="127.0.0.1", port=port, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0), single_connection_client=True))
        return made[-1]

    yield make
    for client in made:
        client.close()


def link_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fault-link"]


def test_redis_answers_through_the_proxy(proxy, connect):
    assert proxy.address == f"127.0.0.1:{proxy.port}"
    client = connect(proxy.port)
    assert client.ping() is True
    assert client.set("fault-link-probe", "x") and client.get("fault-link-probe") == b"x"
    assert proxy.connections == 1


def test_cut_blackholes_open_and_new_connections_until_restored(proxy, connect):
    client = connect(proxy.port)
    assert client.ping() is True
    proxy.cut()
    with pytest.raises(redis.TimeoutError):
        client.ping()                      # on the open connection
    with pytest.raises(redis.TimeoutError):
        client.ping()                      # redis-py dropped it; a new connection hangs too
    assert proxy.connections == 2          # the proxy closed neither: both are held open
    proxy.restore()
    assert connect(proxy.port).ping() is True


def test_a_cut_holds_bytes_and_dials_upstream_only_when_restored():
    upstream = socket.create_server(("127.0.0.1", 0))
    proxy = FaultLink(upstream.getsockname()).start()
    try:
        proxy.cut()
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S)
        client.sendall(b"held")
        upstream.settimeout(TIMEOUT_S)
        with pytest.raises(TimeoutError):
            upstream.accept()              # accepted by the proxy, not passed on
        assert proxy.connections == 1
        proxy.restore()
        upstream.settimeout(5)
        peer, _ = upstream.accept()
        peer.settimeout(5)
        assert peer.recv(4, socket.MSG_WAITALL) == b"held"
        peer.sendall(b"back")
        assert client.recv(4, socket.MSG_WAITALL) == b"back"
        peer.close()
        client.close()
    finally:
        assert proxy.stop()
        upstream.close()


def test_reset_fails_the_next_call_then_the_client_reconnects(proxy, connect):
    client = connect(proxy.port)
    assert client.ping() is True
    proxy.reset()
    wait_until(lambda: proxy.connections == 0, 2, what="the reset connection to close")
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert client.ping() is True           # a new connection, forwarded as usual
    assert proxy.connections == 1


def test_stop_refuses_new_connections_and_closes_open_ones(proxy, upstream, connect):
    client = connect(proxy.port)
    assert client.ping() is True
    assert proxy.stop() is True
    assert proxy.connections == 0
    assert link_threads() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    # A drill can bring the link back on the same port.
    again = FaultLink(upstream, listen_port=proxy.port).start()
    try:
        assert connect(proxy.port).ping() is True
    finally:
        assert again.stop()


def test_stop_ends_connections_held_by_a_cut(proxy):
    proxy.cut()
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    client.sendall(b"PING\r\n")
    wait_until(lambda: proxy.connections == 1, 2, what="the proxy to accept")
    assert proxy.stop() is True
    assert link_threads() == []
    try:
        assert client.recv(16) == b""      # closed, never answered
    except ConnectionResetError:
        pass
    finally:
        client.close()


def test_an_unreachable_upstream_closes_the_client(connect):
    proxy = FaultLink(("127.0.0.1", free_port())).start()
    try:
        with pytest.raises(redis.ConnectionError):
            connect(proxy.port).ping()
        wait_until(lambda: proxy.connections == 0, 2, what="the failed link to close")
    finally:
        assert proxy.stop()

