"""Shared fixtures: one real Redis and one real ZooKeeper per test session, and promtool.

Each test gets its own key prefix (a flow name) so tests never see each
other's state. When a test fails, the servers' log tails are printed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from twinflow.runtime.waiting import wait_for, wait_settled
from twinflow.testing.checker import SETTLE_S
from twinflow.testing.services import LocalServices


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value, or fail after ``timeout_s``."""
    value = wait_for(predicate, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
    return value


def settled(read, timeout_s: float = 30, what: str = "the outputs"):
    """``read()`` once it has stopped changing for ``checker.SETTLE_S``: what a test judges
    exactly-once on, so that a second copy landing after the last first copy is counted."""
    value = wait_settled(read, SETTLE_S, timeout_s, 0.1)
    if value is None:
        raise AssertionError(f"{what} did not stop changing within {timeout_s} s")
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


# What scripts/bootstrap.sh runs when promtool is absent: Debian's prometheus package carries it.
PROMTOOL_APT = "apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus"


@pytest.fixture(scope="session")
def promtool(tmp_path_factory) -> str:
    """The path of promtool (the alerting rules' and the metrics page's checks).

    Absent on a machine where ``make test`` has not bootstrapped: installed as
    scripts/bootstrap.sh does when the tests run as root with apt, one install at a time
    across the test workers. Skipped only when it is absent and cannot be installed."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("promtool is absent and cannot be installed here (needs root and apt): "
                    "run scripts/bootstrap.sh, or apt-get install prometheus")
    lock = tmp_path_factory.getbasetemp().parent / "promtool-install.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another test worker may be installing it
        if not shutil.which("promtool"):
            r = subprocess.run(PROMTOOL_APT, shell=True, capture_output=True, text=True, timeout=600,
                               env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            assert r.returncode == 0, f"{PROMTOOL_APT} failed: {r.stderr[-2000:]}"
    found = shutil.which("promtool")
    assert found and Path(found).is_file(), "the prometheus package was installed without promtool"
    return found


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
# at the end even out when the workers finish. The simulator's files first of all: its two
# longest tests (150 seeded runs; the broken versions it must catch) take a worker for 1-2
# minutes each (in a loaded run of the suite), the longest single files; taken late, one of them
# can keep a worker busy after the others are done.
_LONG_FIRST = ("sim", "cluster", "lab")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        parts = item.nodeid.split("/")
        return _LONG_FIRST.index(parts[1]) if len(parts) > 2 and parts[1] in _LONG_FIRST else len(_LONG_FIRST)

    items.sort(key=rank)  # stable: within a folder, the usual order
