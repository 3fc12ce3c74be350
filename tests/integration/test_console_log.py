"""What a client sends never forges a console log line: control characters in every logged
value (a decoded path, a ``Host``) are written as escapes, on a real server on loopback."""

from __future__ import annotations

import logging
import socket

from tests.conftest import wait_until
from tests.integration.test_audit_store import BROKEN, CALLS
from tests.integration.test_console_app import graph, serve  # noqa: F401 (graph: a fixture)
from twinflow.grpc_security import GrpcSecurity
from twinflow.logs import TextFormatter

FORGED = "%0A2026-01-01 00:00:00,000 INFO twinflow.console: alice resubmitted everything%0D%1B[2J".replace(" ", "%20")


def send(url: str, request: bytes) -> bytes:
    port = int(url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_control_characters_from_a_client_never_start_a_log_line(graph, store, caplog):
    CALLS.clear(), BROKEN.clear()
    server = serve(graph, store, security=GrpcSecurity(tokens={"read": "r-token", "admin": "a-token"}))
    caplog.set_level(logging.DEBUG, logger="twinflow.console")
    try:
        # A refused action logs the API it named, decoded from the path; a foreign Host is logged too.
        send(server.url, b"POST /console/api/x%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer r-token\r\n"
                         b"X-Twinflow-Console: 1\r\nContent-Length: 2\r\n\r\n{}" % FORGED.encode())
        send(server.url, b"GET /console/ HTTP/1.1\r\nHost: evil.example\x1b[2J\r\n\r\n")
        wait_until(lambda: any("refused to" in r.getMessage() for r in caplog.records), 5, what="the refusal logged")
    finally:
        server.stop()
    text = TextFormatter()
    lines = [text.format(r) for r in caplog.records if r.name == "twinflow.console" and not r.exc_info]
    assert any("alice resubmitted everything" in line for line in lines)
    for line in lines:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line, line
    assert any("\\n2026-01-01" in line for line in lines)
    assert any("another Host: evil.example\\x1b[2J" in line for line in lines)
