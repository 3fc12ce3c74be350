"""The console's server under hostile clients, on loopback: idle and slow connections, a
thousand at once, a small file limit, TLS handshakes that never come, requests past their
bounds, and a foreign ``Host`` (DNS rebinding).

The done-when of a console that must survive 1,000 idle connections is tested twice: the
console server in this process (a peer's console is the same :class:`ConsoleServer`, its
metrics app beside it), and the same server in a child process held to a 128-file limit, as a
peer with a low ``ulimit -n`` would hold it: it must answer ``/metrics`` and a console request
meanwhile, and not spin on failed accepts.
"""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trustme
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

from tests.conftest import wait_until
from tests.integration.test_audit_store import BROKEN, CALLS, FLOW
from tests.integration.test_console_app import call, failed_two, graph, serve  # noqa: F401 (graph: a fixture)
from twinflow.cluster.console.bounded_http import Limits
from twinflow.runtime.store.audit import AuditStore

IDLE = 1000
SECURITY = {"content-security-policy", "x-content-type-options", "cache-control"}


@pytest.fixture(autouse=True)
def service():
    CALLS.clear(), BROKEN.clear()


@pytest.fixture
def many_files():
    """Room in this process for a thousand client sockets and the server's own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def open_idle(port: int, n: int = IDLE) -> list[socket.socket]:
    """``n`` connections that send nothing (the kernel completes them whether or not the server accepts)."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    return held


def exchange(port: int, data: bytes, *, timeout: float = 10.0, host: str | None = "127.0.0.1") -> tuple[int, dict, bytes]:
    """Send ``data`` (a request, from its first line) and read the whole answer: (status, headers, body)."""
    if host is not None:
        line, _, rest = data.partition(b"\r\n")
        data = line + b"\r\nHost: " + host.encode() + b"\r\n" + rest
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        sender = threading.Thread(target=_send_all, args=(s, data), daemon=True)
        sender.start()
        answer = _read_all(s, timeout)
        sender.join(timeout)
    return parse_answer(answer)


def _send_all(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError:  # the server answered and closed before it took everything: what is tested
        pass


def _read_all(s, timeout: float) -> bytes:
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        except socket.timeout:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def parse_answer(answer: bytes) -> tuple[int, dict, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/"), answer[:200]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


def closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``s`` (whatever it wrote first), or None if it did not in ``seconds``."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
    except (ConnectionResetError, ssl.SSLError, OSError) as exc:
        if isinstance(exc, socket.timeout):
            return None
    return time.monotonic() - start


def test_a_thousand_idle_connections_take_no_thread_and_leave_metrics_and_the_console_answering(
        graph, store, many_files):
    registry = CollectorRegistry()
    Counter("twinflow_test_requests", "a metric the page answers", registry=registry).inc()
    server = serve(graph, store, metrics=make_wsgi_app(registry))
    port = port_of(server.url)
    threads_before = threading.active_count()
    idle = open_idle(port)
    try:
        # The flood is accepted (and the oldest closed to make room) without a thread per connection.
        wait_until(lambda: server._http.evicted >= IDLE - server._http.cap, 20,
                   what=f"the idle connections accepted: {server._http.evicted} closed to make room")
        assert threading.active_count() <= threads_before + Limits().workers, threading.enumerate()
        assert server.held <= server._http.cap
        started = time.monotonic()
        status, headers, body = exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert status == 200 and b"twinflow_test_requests_total 1.0" in body
        assert SECURITY <= set(headers)
        status, snap = call(server.url, "/console/api/snapshot")
        assert status == 200 and snap["redis"] == "ok"
        assert time.monotonic() - started < 5
    finally:
        for s in idle:
            s.close()
        server.stop()


CHILD = """
import sys, time
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app
from twinflow.cluster.console.access import ConsoleAccess
from twinflow.cluster.console.app import ConsoleApp
from twinflow.cluster.console.server import ConsoleServer
from twinflow.cluster.console.snapshot import ConsoleView
from twinflow.cluster.operator_stores import operator_stores
from twinflow.runtime.flowgraph import parse_graph
graph = parse_graph(open(sys.argv[1]).read())
registry = CollectorRegistry()
Counter("twinflow_child_requests", "a metric", registry=registry).inc()
app = ConsoleApp(ConsoleView(graph, operator_stores(graph, sys.argv[2], "console")), ConsoleAccess(None))
server = ConsoleServer(app, "127.0.0.1:0", metrics=make_wsgi_app(registry))
print(server.url, flush=True)
sys.stdin.read()   # until the test closes it
server.stop()
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_under_a_128_file_limit_a_thousand_idle_connections_neither_starve_requests_nor_spin(
        graph, redis_url, tmp_path, many_files):
    flow = tmp_path / "flow.yaml"
    flow.write_text(FLOW.replace("flow: f\n", f"flow: {graph.name}\n"))
    (tmp_path / "child.py").write_text(CHILD)

    def limit() -> None:  # the child's file limit, as a peer started with ulimit -n 128 has it
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    child = subprocess.Popen([sys.executable, str(tmp_path / "child.py"), str(flow), redis_url],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp_path / "child.log", "w"),
                             preexec_fn=limit, text=True,  # the flow's handler is a module of tests/
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    idle = []
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        url = child.stdout.readline().strip() if ready else ""
        assert url.startswith("http://127.0.0.1:"), (tmp_path / "child.log").read_text()
        port = port_of(url)
        idle = open_idle(port)
        cpu_before, started = cpu_seconds(child.pid), time.monotonic()
        status, _, body = exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert status == 200 and b"twinflow_child_requests_total 1.0" in body
        status, _, body = exchange(port, b"GET /console/api/whoami HTTP/1.1\r\n\r\n")
        assert status == 200 and json.loads(body)["may_look"]
        assert time.monotonic() - started < 10
        # Then a few seconds with the idle connections still open: the child must not spin.
        window = time.monotonic()
        status, _, _ = exchange(port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert status == 200
        time.sleep(max(0.0, 3.0 - (time.monotonic() - window)))  # the window CPU is measured over, not a wait
        used = cpu_seconds(child.pid) - cpu_before
        assert used < 1.5, f"the child used {used:.2f} CPU-s with {IDLE} idle connections"
        assert child.poll() is None, (tmp_path / "child.log").read_text()
    finally:
        for s in idle:
            s.close()
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


def test_a_silent_a_trickling_and_a_handshake_less_client_are_closed_at_their_deadline(graph, store, tmp_path):
    limits = Limits(request_s=0.5, handshake_s=0.5)
    server = serve(graph, store, limits=limits)
    port = port_of(server.url)
    try:
        with socket.create_connection(("127.0.0.1", port)) as silent:
            took = closed_within(silent, 5)
            assert took is not None and took < 3, took
        with socket.create_connection(("127.0.0.1", port)) as trickling:
            trickling.sendall(b"GET /console/api/flow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            started, answer = time.monotonic(), b""
            while time.monotonic() - started < 5:  # a byte every 0.1 s, until the server answers
                readable, _, _ = select.select([trickling], [], [], 0.1)
                if readable:
                    answer = _read_all(trickling, 2)
                    break
                trickling.sendall(b"a")
            assert time.monotonic() - started < 3
            status, headers, _ = parse_answer(answer)
            assert status == 408 and SECURITY <= set(headers)
    finally:
        server.stop()

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    server = serve(graph, store, cert=str(tmp_path / "cert.pem"), key=str(tmp_path / "key.pem"), limits=limits)
    try:
        with socket.create_connection(("127.0.0.1", port_of(server.url))) as no_hello:
            took = closed_within(no_hello, 5)
            assert took is not None and took < 3, took
        context = ssl.create_default_context()
        ca.configure_trust(context)
        assert call(server.url, "/console/api/flow", context=context)[0] == 200  # a real client still gets in
    finally:
        server.stop()


def test_a_request_past_its_bounds_is_refused_clearly_with_the_security_headers(graph, store):
    o1, _ = failed_two(store)
    server = serve(graph, store)
    port = port_of(server.url)
    refs = json.dumps({"refs": [o1]}).encode()
    huge = refs[:-1] + b" " * (3 << 20) + b"}"  # 3 MiB: past the 1 MiB a body may be
    action = b"POST /console/api/resubmit HTTP/1.1\r\nX-Twinflow-Console: 1\r\nContent-Type: application/json\r\n"
    try:
        for length, body, expected in ((b"-1", huge, 400), (b"abc", refs, 400), (b"%d" % len(huge), huge, 413),
                                       (None, refs, 411)):
            head = action + (b"Content-Length: " + length + b"\r\n" if length is not None else b"")
            status, headers, text = exchange(port, head + b"\r\n" + body)
            assert status == expected, (length, status, text[:200])
            assert SECURITY <= set(headers), headers
        status, _, text = exchange(port, action + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        assert status == 411 and b"chunked" in text
        assert AuditStore(store).entry(o1).status == "FAILED"  # nothing got past

        # The server's own refusals carry the page's headers too: a line or a head too long, nonsense.
        for request, expected in ((b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
                                  (b"GET /console/ HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
                                  (b"GET /console/ HTTP/1.1\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", 431),
                                  (b"NONSENSE\r\n\r\n", 400)):
            status, headers, _ = exchange(port, request, host=None)
            assert status == expected and SECURITY <= set(headers), (request[:40], status, headers)
        status, _, _ = exchange(port, b"POST /console/api/resubmit HTTP/1.1\r\nX-Twinflow-Console: 1\r\n"
                                      b"Content-Length: %d\r\n\r\n" % len(refs) + refs)
        assert status == 200 and AuditStore(store).entry(o1).status == "RESUBMITTED"  # a right one is taken
    finally:
        server.stop()


def test_a_request_for_another_host_is_refused_before_it_reads_or_acts(graph, store, tmp_path):
    o1, _ = failed_two(store)
    registry = CollectorRegistry()
    server = serve(graph, store, metrics=make_wsgi_app(registry), hosts=["console.example"])
    port = port_of(server.url)
    rebound = f"attacker.example:{port}"
    try:
        # What a page of attacker.example sends once its name resolves to 127.0.0.1: its own Host and
        # Origin, and the console's header (same origin now, so the browser asks nobody).
        status, headers, text = exchange(
            port, b"POST /console/api/resubmit HTTP/1.1\r\nOrigin: http://%s\r\nX-Twinflow-Console: 1\r\n"
                  b"Content-Length: %d\r\n\r\n" % (rebound.encode(), len(json.dumps({"refs": [o1]})))
            + json.dumps({"refs": [o1]}).encode(), host=rebound)
        assert status == 421 and SECURITY <= set(headers) and b"attacker" not in text
        for path in (b"/console/api/failures", f"/console/api/failures/{o1}".encode(), b"/metrics"):
            assert exchange(port, b"GET %s HTTP/1.1\r\n\r\n" % path, host=rebound)[0] == 421
        assert exchange(port, b"GET /console/api/flow HTTP/1.0\r\n\r\n", host=None)[0] == 421  # no Host at all
        assert AuditStore(store).entry(o1).status == "FAILED"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", "console.example:8470"):
            assert exchange(port, b"GET /console/api/failures HTTP/1.1\r\n\r\n", host=host)[0] == 200, host
    finally:
        server.stop()

    # Over TLS, the names of the console's certificate too.
    ca = trustme.CA()
    cert = ca.issue_cert("console.test", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(tmp_path / "cert.pem")
    cert.private_key_pem.write_to_path(tmp_path / "key.pem")
    server = serve(graph, store, cert=str(tmp_path / "cert.pem"), key=str(tmp_path / "key.pem"))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    try:
        for host, expected in (("console.test", 200), ("elsewhere.test", 421)):
            with socket.create_connection(("127.0.0.1", port_of(server.url)), timeout=10) as raw:
                with context.wrap_socket(raw, server_hostname="console.test") as s:
                    s.sendall(b"GET /console/api/flow HTTP/1.1\r\nHost: %s\r\n\r\n" % host.encode())
                    assert parse_answer(_read_all(s, 10))[0] == expected, host
    finally:
        server.stop()
