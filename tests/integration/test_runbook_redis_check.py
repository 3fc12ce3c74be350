"""The runbook's Redis check (docs/operations/runbooks.md, TwinflowRedisDown), run as written against
a real Sentinel and a primary with a password, the deployment guide's service name: it answers
PONG with the password file, says NOAUTH or WRONGPASS without the right one, where the command it
replaces (``redis-cli -u $TWINFLOW_REDIS ping``) cannot read the URL at all."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.monitoring import runbook_sections, shell_blocks
from twinflow.testing.redis_ha import LocalSentinel

PASSWORD = "runbook pw"

pytestmark = pytest.mark.skipif(shutil.which("redis-cli") is None, reason="needs redis-cli (apt-get install redis-tools)")


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    group = LocalSentinel.start(str(tmp_path_factory.mktemp("runbook-sentinel")), replicas=0, sentinels=1,
                                service="twinflow", password=PASSWORD)
    yield group
    group.stop()


def check_block() -> str:
    """The runbook's block that asks a Sentinel for the primary and pings it."""
    return next(b for b in shell_blocks(runbook_sections()["TwinflowRedisDown"]) if "get-master-addr-by-name" in b)


def run_check(sentinel: LocalSentinel, password_file) -> subprocess.CompletedProcess:
    """The block on this machine: the guide's first Sentinel is ours, its password file the given one."""
    block = (check_block().replace("host-a.example", "127.0.0.1")
             .replace("-p 26379", f"-p {sentinel.sentinels[0].port}")
             .replace("/etc/twinflow/redis.pw", str(password_file)))
    return subprocess.run(["sh", "-c", block], capture_output=True, text=True, timeout=30)


def test_the_runbooks_check_reaches_the_primary_the_sentinel_names_with_the_password(sentinel, tmp_path):
    pw = tmp_path / "redis.pw"
    pw.write_text(PASSWORD + "\n")  # as a file of the guide's: one line
    r = run_check(sentinel, pw)
    assert r.returncode == 0, r.stdout + r.stderr
    primary = sentinel.servers[0].port
    assert r.stdout.splitlines() == [f"the Sentinel names the primary 127.0.0.1:{primary}", "PONG"]
    assert PASSWORD not in r.stdout + r.stderr


def test_the_runbooks_check_says_when_the_password_is_wrong(sentinel, tmp_path):
    pw = tmp_path / "wrong.pw"
    pw.write_text("not the password\n")
    r = run_check(sentinel, pw)
    said = r.stdout + r.stderr
    assert "PONG" not in said and ("WRONGPASS" in said or "NOAUTH" in said), said


def test_the_command_it_replaces_cannot_read_a_sentinel_url(sentinel):
    r = subprocess.run(["redis-cli", "-u", sentinel.url, "ping"], capture_output=True, text=True, timeout=30)
    assert "PONG" not in r.stdout, r.stdout + r.stderr
