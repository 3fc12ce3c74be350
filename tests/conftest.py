"""Shared fixtures: one real Redis and one real ZooKeeper per test session.

Each test gets its own key prefix (a flow name) so tests never see each
other's state. When a test fails, the servers' log tails are printed.
"""

from __future__ import annotations

import uuid

import pytest

from twinflow.runtime.waiting import wait_for
from twinflow.testing.services import LocalServices


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value, or fail after ``timeout_s``."""
    value = wait_for(predicate, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
    return value


@pytest.fixture(scope="session")
def services():
    svc = LocalServices.start()
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def redis_url(services) -> str:
    return services.redis_url


@pytest.fixture(scope="session")
def zk_hosts(services) -> str:
    return services.zk_hosts


@pytest.fixture
def flow_name() -> str:
    """A flow name no other test uses: every Redis key and ZooKeeper path hangs off it."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "services" in item.fixturenames:
        svc = item.funcargs.get("services")
        if svc is not None:
            report.sections.append(("server logs", svc.logs()))


# The folders whose tests start processes and wait on failovers (tens of seconds each) run
# first: the pytest-xdist workers take files in this order, and the many short files left
# at the end even out when the workers finish.
_LONG_FIRST = ("cluster", "sim", "lab")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        parts = item.nodeid.split("/")
        return _LONG_FIRST.index(parts[1]) if len(parts) > 2 and parts[1] in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: within a folder, the usual order
