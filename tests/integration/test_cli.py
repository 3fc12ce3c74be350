"""The `twinflow` command as a user runs it: services, refusals, waiting for servers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from twinflow.testing.servers import free_port
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "cluster.yaml")


def twinflow(*args, timeout=60, cwd=None):
    return subprocess.run([sys.executable, "-m", "twinflow.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_services_up_status_down(tmp_path):
    state = str(tmp_path / "services.json")
    up = twinflow("services", "up", "--state", state)
    assert up.returncode == 0, up.stderr
    assert "redis     redis://127.0.0.1:" in up.stdout and "zookeeper 127.0.0.1:" in up.stdout
    recorded = json.loads(Path(state).read_text())
    pids = [s["pid"] for s in recorded["servers"]]
    try:
        again = twinflow("services", "up", "--state", state)
        assert again.returncode == 0 and "already up" in again.stdout
        st = twinflow("services", "status", "--state", state)
        assert st.returncode == 0, st.stdout
        rows = [line.split() for line in st.stdout.splitlines()[2:]]
        assert sorted((r[0], r[3], r[4]) for r in rows) == [("redis", "yes", "yes"), ("zookeeper", "yes", "yes")]
    finally:
        down = twinflow("services", "down", "--state", state)
    assert down.returncode == 0 and "stopped" in down.stdout
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not Path(state).exists()


def test_bad_flow_file_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "flow.yaml"
    text = Path(EXAMPLE).read_text().replace("bake_time: 5.0", "bake_time: -3")
    bad.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "bake_time: -3" in t)
    r = twinflow("run", str(bad), "--peer-id", "a", "--redis", "redis://127.0.0.1:1/0", "--zk", "127.0.0.1:1")
    assert r.returncode == 2
    assert f"{bad}:{line}: nodes.claims.bake_time: must be seconds in (0, 86400] (got -3)" in r.stderr


def test_node_waits_for_redis_then_names_it(tmp_path):
    port = free_port()
    r = twinflow("run", EXAMPLE, "--peer-id", "a", "--redis", f"redis://127.0.0.1:{port}/0",
                 "--zk", "127.0.0.1:1", "--connect-timeout", "1.5", "--state-dir", str(tmp_path))
    assert r.returncode == 3
    assert f"waiting for Redis at redis://127.0.0.1:{port}/0" in r.stderr
    assert f"Redis at redis://127.0.0.1:{port}/0 did not answer within" in r.stderr


def test_node_waits_for_zookeeper_then_names_it(tmp_path, redis_url):
    port = free_port()
    r = twinflow("run", EXAMPLE, "--peer-id", "a", "--redis", redis_url, "--zk", f"127.0.0.1:{port},127.0.0.1:1",
                 "--connect-timeout", "2", "--state-dir", str(tmp_path))
    assert r.returncode == 3
    assert f"ZooKeeper at 127.0.0.1:{port},127.0.0.1:1 did not answer within" in r.stderr


def test_status_reads_every_live_node(redis_url, tmp_path):
    flow = tmp_path / "flow.yaml"
    flow.write_text(Path(EXAMPLE).read_text().replace("flow: demo", "flow: clistatus"))
    import redis

    store = FlowStore(redis.Redis.from_url(redis_url), FlowKeys("clistatus"), "n1")
    store.write_status({"peer_id": "n1", "role": "master", "epoch": 4, "baked": 0, "claimed": 0,
                        "rolled_back": 2, "delivered": 10, "failed": 1, "unclaimed": 0, "grpc_address": "h:1",
                        "rule_pending": {"orders": 3, "payments": 0, "nohit": 0}})
    positions = store.publish([b"{}"] * 3)
    r = twinflow("status", str(flow), "--redis", redis_url, "--json")
    assert r.returncode == 0, r.stderr
    (peer,) = json.loads(r.stdout)["peers"]
    assert peer["role"] == "master" and peer["epoch"] == "4" and peer["uplink_lag"] == 3
    # The live lag in the uplink's time: nothing read yet, so from the oldest entry to the newest.
    first, newest = (int(positions[i].split("-")[0]) for i in (0, -1))
    assert peer["uplink_lag_s"] == (newest - first) / 1000
    assert peer["rule_pending"] == {"orders": 3, "payments": 0, "nohit": 0}  # RULE_PEND, a mapping again
    table = twinflow("status", str(flow), "--redis", redis_url)
    assert table.stdout.splitlines()[0].split()[:4] == ["peer_id", "role", "epoch", "uplink_lag"]
    assert table.stdout.splitlines()[2].split()[:4] == ["n1", "master", "4", "3"]
    assert table.stdout.splitlines()[0].split()[-1] == "rule_pending"
    assert table.stdout.splitlines()[2].endswith("orders=3 payments=0 nohit=0")


@pytest.mark.parametrize("args", [["demo", "--help"], ["services", "--help"], ["run", "--help"]])
def test_help(args):
    assert twinflow(*args).returncode == 0
