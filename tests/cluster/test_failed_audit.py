"""Failed messages on a real two-peer cluster: service errors in an action's handler are audited,
listed with ``twinflow failures``, resubmitted through a peer's Admin service once the service is
fixed, and each runs exactly once more (the handler's calls counted in a file) with its outcome
recorded; the worker reads each resubmit as the master does and holds none of them;
the publisher reads its error notices with a cursor across a reconnect of its client.

Two ``twinflow run`` processes (a master and a worker of the claim pair) on the session's
redis-server and ZooKeeper; the CLI and the client are processes and sockets of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.cluster.harness import cluster_on
from tests.conftest import wait_until
from twinflow.client import Client

pytestmark = pytest.mark.cluster

FLOW = """\
flow: audit
uplink: {stream: uplink}
message: {id: id, id_ttl: 86400}
input: deliver
nodes:
  deliver: {type: action, handler: "handlers:deliver", max_retries: 0, sink: {stream: sink}}
  claims: {type: sort, pairs_with: deliver, key: seq, key_type: int, bake_time: 3}
cluster: {session_timeout: 2.0}
"""

# The service the action calls: every call is a line of calls.log; while the file "broken"
# exists, a message with "fail" is refused (a service error: the action's error outlink).
HANDLERS = '''\
from pathlib import Path

HERE = Path(__file__).parent


def deliver(msg):
    with open(HERE / "calls.log", "a") as calls:
        calls.write(msg.id + "\\n")
    if msg.doc.get("fail") and (HERE / "broken").exists():
        raise RuntimeError("the service refused " + msg.id)
'''


def test_failed_messages_are_audited_resubmitted_once_more_and_noticed_by_their_publisher(services, tmp_path,
                                                                                          flow_name):
    (tmp_path / "handlers.py").write_text(HANDLERS)
    (tmp_path / "broken").touch()
    calls = tmp_path / "calls.log"

    def called() -> Counter:
        return Counter(calls.read_text().split()) if calls.exists() else Counter()

    c = cluster_on(services, tmp_path, flow_name, text=FLOW)
    try:
        c.peer("a")
        c.wait_status("a", role="master", streaming=1)
        c.peer("b", extra=["--worker-read-behind-ms", "0"])  # the worker bakes what it reads at once
        c.wait_status("b", role="worker", streaming=1)
        address = c.live_address()

        with Client(address, flow_name) as client:
            client.publish([{"id": f"o{n}", "seq": n, **({"fail": True} if n in (2, 4) else {})}
                            for n in range(1, 6)], publisher="shop")
        wait_until(lambda: c.redis.xlen(c.key("audit")) == 2 and sum(called().values()) == 5, 60,
                   what="five calls, two of them refused and audited")

        with Client(address, flow_name) as client:  # the publisher's notices, a page at a time
            first, cursor = client.notices("shop", max_count=1)
        with Client(c.live_address(avoid="b"), flow_name) as client:  # a new connection, the cursor kept
            rest, cursor = client.notices("shop", after=cursor)
            assert client.notices("shop", after=cursor) == ([], cursor)
        assert [(n["id"], n["outlink"], n["publisher"]) for n in first + rest] == [
            ("o2", "error", "shop"), ("o4", "error", "shop")]
        assert all("the service refused" in n["reason"] for n in first + rest)

        def twinflow(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "twinflow.cli", "failures", *args], capture_output=True,
                                  text=True, timeout=60, cwd=tmp_path)

        listed = twinflow("list", str(c.flow_path), "--redis", c.redis_url, "--json")
        assert listed.returncode == 0, listed.stderr
        entries = json.loads(listed.stdout)["entries"]
        assert [(e["id"], e["node"], e["outlink"], e["status"]) for e in entries] == [
            ("o2", "deliver", "error", "FAILED"), ("o4", "deliver", "error", "FAILED")]

        (tmp_path / "broken").unlink()  # the service is fixed
        done = twinflow("resubmit", str(c.flow_path), "--all", "--by", "ops-anna", "--peer", address)
        assert done.returncode == 0 and "2 resubmitted, 0 refused" in done.stdout, done.stderr
        wait_until(lambda: c.redis.hlen(c.key("audit:outcomes")) == 2, 60, what="both resubmits to leave the flow")
        assert called() == {"o1": 1, "o2": 2, "o3": 1, "o4": 2, "o5": 1}  # each exactly once more
        sink = [f[b"id"].decode() for _, f in c.redis.xrange(c.sink_key)]
        assert sorted(sink) == ["o1", "o2", "o3", "o4", "o5"]  # each delivered once, under its own ID
        for e in entries:
            shown = twinflow("show", str(c.flow_path), e["audit_id"], "--redis", c.redis_url)
            assert shown.returncode == 0 and "RESUBMITTED" in shown.stdout and "by ops-anna" in shown.stdout
            assert "left by deliver.done" in shown.stdout
        again = twinflow("resubmit", str(c.flow_path), entries[0]["audit_id"], "--redis", c.redis_url)
        assert again.returncode == 1 and "already resubmitted" in again.stderr

        # The worker read each envelope as the master did (none was bad input to it), baked it under a
        # claim of its own, and holds none: the master's claim released it, or it found it processed.
        worker = wait_until(lambda: (st := c.status("b")).get("baked") == "0" and st, 30,
                            what=f"the worker's bake to settle: {c.status('b')}")
        assert (worker["failed"], worker["unclaimed"], worker["claims_unproven"]) == ("0", "0", "0"), worker
        assert called() == {"o1": 1, "o2": 2, "o3": 1, "o4": 2, "o5": 1}  # and nothing ran since
    finally:
        c.stop()
