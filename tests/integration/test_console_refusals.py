"""What the console answers when Redis is not as it should be: down or silent, a prompt 503,
never a five-minute wait.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.integration.test_audit_store import BROKEN, CALLS
from tests.integration.test_console_app import call, graph  # noqa: F401 (graph: a fixture)
from twinflow.cluster.console.access import ConsoleAccess
from twinflow.cluster.console.app import ConsoleApp
from twinflow.cluster.console.server import ConsoleServer
from twinflow.cluster.console.snapshot import REDIS_DEADLINE_S, ConsoleView, console_stores

PROMPT_S = 3 * REDIS_DEADLINE_S + 2  # a call's deadline, a retry's pause and the HTTP round trip, with room


@pytest.fixture(autouse=True)
def service():
    CALLS.clear(), BROKEN.clear()


@pytest.fixture(params=["refused", "silent"])
def dead_redis(request):
    """A Redis URL where nothing answers: a port nobody listens on, or a socket that takes the
    connection and never says a word (the kernel completes it; nobody reads)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        if request.param == "silent":
            held.listen(64)
        yield f"redis://127.0.0.1:{held.getsockname()[1]}/0"


def test_with_redis_down_every_api_answers_503_within_seconds(graph, dead_redis):
    started = time.monotonic()
    stores = console_stores(graph, dead_redis, who="console")
    app = ConsoleApp(ConsoleView(graph, stores), ConsoleAccess(None))
    server = ConsoleServer(app, "127.0.0.1:0")
    try:
        for path, body in (("/console/api/failures", None), ("/console/api/failures/1700000000000-0", None),
                           ("/console/api/resubmit", {"refs": ["1700000000000-0", "1700000000001-0"]})):
            asked = time.monotonic()
            status, answer = call(server.url, path, body=body)
            took = time.monotonic() - asked
            assert status == 503 and answer["error"].startswith("Redis did not answer"), (path, answer)
            assert took < PROMPT_S, f"{path} took {took:.1f} s"
        assert [r["ok"] for r in answer["results"]] == [False, False]  # the resubmit says what it did not do
        asked = time.monotonic()
        status, snap = call(server.url, "/console/api/snapshot")
        assert status == 200 and snap["redis"].startswith("Redis did not answer")
        assert time.monotonic() - asked < PROMPT_S
    finally:
        server.stop()
    assert time.monotonic() - started < 6 * PROMPT_S
