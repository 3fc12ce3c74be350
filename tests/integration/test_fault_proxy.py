"""The Toxiproxy-compatible fault proxy (``twinflow proxy``), driven by the toxiproxy-python client.

The server runs as its own process; its upstream is the session's real
redis-server. Timings are measured for real.
"""

import json
import socket
import subprocess
import sys
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from tests.conftest import wait_until


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "twinflow.cli", "proxy", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()  # "twinflow proxy: Toxiproxy API on 127.0.0.1:<port>", or EOF if it died
    assert "Toxiproxy API on" in line, line
    port = int(line.rsplit(":", 1)[1])
    toxiproxy = Toxiproxy()
    toxiproxy.update_api_consumer("127.0.0.1", port)
    yield toxiproxy
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def proxy(server, redis_url, flow_name):
    upstream = redis_url.split("//")[1].split("/")[0]
    p = server.create(upstream=upstream, name=flow_name)
    yield p
    server.destroy(p)


def client(proxy, timeout: float = 5) -> redis.Redis:
    """A Redis client through the proxy, without redis-py's own retries (a fault must show)."""
    host, port = proxy.listen.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), socket_timeout=timeout, retry=Retry(NoBackoff(), 0))


def timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def test_the_api_answers_as_toxiproxy_does(server, proxy):
    assert int(proxy.listen.rsplit(":", 1)[1]) != 0  # listen port 0 resolved to the real one
    assert server.proxies()[proxy.name].upstream == proxy.upstream
    assert json.loads(server.version())["version"]
    with pytest.raises(ProxyExists):
        APIConsumer.post("/proxies", json={"name": proxy.name, "upstream": proxy.upstream})
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/no-such-proxy")
    with pytest.raises(NotFound):
        APIConsumer.delete(f"/proxies/{proxy.name}/toxics/no-such-toxic")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="teleport")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"latency": -5})
    proxy.add_toxic(type="latency", attributes={"latency": 10})
    with pytest.raises(ProxyExists):
        proxy.add_toxic(type="latency", attributes={"latency": 10})
    toxic = proxy.get_toxic("latency_downstream")
    assert (toxic.type, toxic.stream, toxic.toxicity, toxic.attributes) == \
        ("latency", "downstream", 1.0, {"latency": 10, "jitter": 0})
    updated = APIConsumer.post(f"/proxies/{proxy.name}/toxics/latency_downstream",
                               json={"attributes": {"latency": 20}}).json()
    assert updated["attributes"]["latency"] == 20
    assert proxy.destroy_toxic("latency_downstream") and proxy.toxics() == {}


def test_latency_delays_a_round_trip_on_a_connection_already_open(proxy):
    r = client(proxy)
    assert timed(r.ping) < 0.2
    proxy.add_toxic(type="latency", attributes={"latency": 200, "jitter": 20})
    assert 0.18 <= timed(r.ping) < 1.0  # the open connection feels it (200 ms +/- 20)
    proxy.destroy_toxic("latency_downstream")
    assert timed(r.ping) < 0.2


def test_latency_delays_each_chunk_from_its_arrival_not_one_after_another(proxy, redis_url, flow_name):
    # 1 MB is over 30 chunks: delayed one after another they would take over 3 s. The
    # redis-latency drill found it (the master's replies grew slow enough to lose its lease).
    redis.Redis.from_url(redis_url).set(f"{flow_name}:big", b"x" * 1_000_000)
    r = client(proxy, timeout=30)
    plain = timed(lambda: r.get(f"{flow_name}:big"))
    proxy.add_toxic(type="latency", attributes={"latency": 100})
    proxy.add_toxic(type="latency", name="more", attributes={"latency": 100})
    took = timed(lambda: r.get(f"{flow_name}:big"))
    # The two toxics add up (200 ms); one after another, 30 chunks would add 6 s.
    assert 0.18 <= took - plain < 1.5, (took, plain)


def test_a_toxic_with_toxicity_0_never_applies(proxy):
    proxy.add_toxic(type="latency", attributes={"latency": 1000}, toxicity=0.0)
    assert timed(client(proxy).ping) < 0.5


def test_bandwidth_of_100_kb_s_takes_about_10_s_for_1_mb(proxy, redis_url, flow_name):
    direct = redis.Redis.from_url(redis_url)
    direct.set(f"{flow_name}:big", b"x" * 1_000_000)
    r = client(proxy, timeout=30)
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})
    took = timed(lambda: r.get(f"{flow_name}:big"))
    assert 9.0 <= took <= 12.0, took


def test_disabling_closes_the_listener_and_every_open_connection(proxy):
    r = client(proxy)
    r.ping()
    with proxy.down():
        with pytest.raises(redis.ConnectionError):
            r.ping()  # its connection was closed, and a new one is refused
        host, port = proxy.listen.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=1).recv(1)
    assert client(proxy).ping()  # listening again on the same address


def test_timeout_stops_the_data_then_closes_the_connection(proxy):
    s = raw(proxy)
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 500})
    t0 = time.monotonic()
    s.sendall(b"PING\r\n")
    assert read_all(s) == b""  # the PING never reached Redis; the proxy closed the connection
    assert 0.45 <= time.monotonic() - t0 < 2.0


def raw(proxy) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"PING\r\n")
    assert s.recv(100) == b"+PONG\r\n"  # connected through to Redis
    return s


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_reset_peer_resets_the_connection(proxy):
    s = raw(proxy)
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
    with pytest.raises(ConnectionResetError):
        read_all(s)


def test_limit_data_closes_the_connection_after_that_many_bytes(proxy):
    s = raw(proxy)
    proxy.add_toxic(type="limit_data", attributes={"bytes": 7 + 10})  # 7 already passed: the first PONG
    s.sendall(b"PING\r\n" * 5)
    assert read_all(s) == b"+PONG\r\n+PO"  # 10 more bytes: one PONG (7) and 3 of the next


def test_slicer_cuts_the_data_in_pieces_and_delays_each(proxy, redis_url, flow_name):
    redis.Redis.from_url(redis_url).set(f"{flow_name}:mid", b"y" * 100_000)
    proxy.add_toxic(type="slicer", attributes={"average_size": 1000, "size_variation": 100, "delay": 2000})
    r = client(proxy)
    t0 = time.monotonic()
    assert r.get(f"{flow_name}:mid") == b"y" * 100_000
    assert time.monotonic() - t0 >= 100 * 0.002  # about 100 pieces, 2 ms after each


def test_slow_close_delays_the_close(proxy):
    s = raw(proxy)
    proxy.add_toxic(type="slow_close", attributes={"delay": 500})
    t0 = time.monotonic()
    s.sendall(b"QUIT\r\n")
    assert read_all(s) == b"+OK\r\n"
    assert time.monotonic() - t0 >= 0.45


def test_populate_and_reset(server, redis_url, flow_name):
    upstream = redis_url.split("//")[1].split("/")[0]
    made = server.populate([{"name": f"{flow_name}-1", "upstream": upstream, "listen": "127.0.0.1:0"},
                            {"name": f"{flow_name}-2", "upstream": upstream, "listen": "127.0.0.1:0"}])
    assert len(made) == 2
    one = server.get_proxy(f"{flow_name}-1")
    one.add_toxic(type="latency", attributes={"latency": 100})
    one.disable()
    assert server.reset()
    wait_until(lambda: server.get_proxy(f"{flow_name}-1").enabled, 5, what="the proxy enabled again")
    assert server.get_proxy(f"{flow_name}-1").toxics() == {}
    assert timed(client(server.get_proxy(f"{flow_name}-1")).ping) < 0.1
    for p in made:
        server.destroy(p)
