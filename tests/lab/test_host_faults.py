"""The parts of the drills between hosts that need no running lab: a host's packet drops on a
real two-host network (root), a wall clock put off by libfaketime in a real child process, the
lab's sharded flow file, and the figures a drill computes from what left the flow."""

from __future__ import annotations

import os
import socket
import subprocess
import types

import pytest

from twinflow.chaos.host_drills import max_gap_s, timeout_errors
from twinflow.testing.checker import SinkEntry
from twinflow_dev.lab_faults import HostFirewall, LabFaultUnavailable, fake_clock_env, true_clock_java
from twinflow_dev.lab_hosts import LabPlan
from tests.lab.conftest import lab_prefix
from twinflow_dev.lab_network import LabState, create, entered, ns_inode, teardown


@pytest.fixture
def two_hosts(tmp_path):
    state = LabState(prefix=lab_prefix("tfhf"), subnet="10.213.48.0/24")
    state.add_host("a", 31)
    state.add_host("b", 32)
    try:
        create(state, tmp_path / "lab.json")
        yield types.SimpleNamespace(state=state)
    finally:
        teardown(state)
        assert [ns for ns in state.namespaces if ns_inode(ns) is not None] == []


def datagram_arrives(net, src: str, dst: str) -> bool:
    """A UDP datagram from host ``src`` to host ``dst``: whether it arrives within 1 s."""
    with entered(net.state.host(dst).ns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with entered(net.state.host(src).ns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((net.state.host(dst).address, 0))
        rx.settimeout(1.0)
        try:
            tx.sendto(b"ping", rx.getsockname())
        except PermissionError:  # the sender's own firewall dropped it on the way out
            return False
        try:
            return rx.recv(16) == b"ping"
        except socket.timeout:
            return False


def test_a_host_drops_what_it_sends_and_receives_only_on_its_own_firewall(two_hosts):
    if subprocess.run(["which", "nft"], capture_output=True).returncode != 0:
        pytest.skip("nft is not installed")
    b_addr = two_hosts.state.host("b").address
    assert datagram_arrives(two_hosts, "a", "b") and datagram_arrives(two_hosts, "b", "a")
    fw = HostFirewall(two_hosts, "a")
    fw.drop([b_addr], direction="out")  # asymmetric: a's packets to b lost, b's to a arrive
    assert not datagram_arrives(two_hosts, "a", "b")
    assert datagram_arrives(two_hosts, "b", "a")
    fw.drop([b_addr])                   # and now both ways
    assert not datagram_arrives(two_hosts, "b", "a")
    fw.heal()
    assert datagram_arrives(two_hosts, "a", "b") and datagram_arrives(two_hosts, "b", "a")
    # Nothing reached this machine's own firewall.
    assert "twinflow_lab" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def test_a_fake_clock_puts_a_child_process_wall_clock_off_and_leaves_its_monotonic_clock():
    try:
        env = fake_clock_env(-5)
    except LabFaultUnavailable as exc:
        pytest.skip(str(exc))
    assert env["FAKETIME"] == "-5"
    # Python 3.11's sleep is an absolute clock_nanosleep on the monotonic clock: Debian 12's
    # libfaketime fails it with EINVAL.
    code = "import time; time.sleep(0.05); print(time.time(), time.monotonic())"
    import sys
    import time

    before_wall, before_mono = time.time(), time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, timeout=30).stdout.split()
    after_wall, after_mono = time.time(), time.monotonic()
    wall, mono = float(out[0]), float(out[1])
    assert before_wall - 5 - 0.5 <= wall <= after_wall - 5 + 0.5  # five seconds behind
    assert before_mono <= mono <= after_mono                      # the monotonic clock is true


def test_a_true_clock_java_runs_without_the_fake_clock(tmp_path):
    import time

    try:
        env = {**os.environ, **fake_clock_env(60), **true_clock_java(tmp_path / "jh")}
    except LabFaultUnavailable as exc:
        pytest.skip(str(exc))
    source = tmp_path / "Now.java"
    source.write_text("public class Now { public static void main(String[] a) "
                      "{ System.out.println(System.currentTimeMillis()); } }")
    before = time.time()
    # What spark-class runs: $JAVA_HOME/bin/java, here with the fake clock's variables set.
    out = subprocess.run([f"{env['JAVA_HOME']}/bin/java", str(source)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert before - 1 <= int(out.stdout) / 1000 <= time.time() + 1  # true, not a minute ahead


def test_the_lab_flow_in_shards_is_the_chained_flow_keyed_by_order(tmp_path):
    from twinflow.cluster.on_cluster import cluster_flow
    from twinflow.runtime.flowgraph import load_graph

    plan = LabPlan(tmp_path, LabState(), short=False, flow="drill", shards=2)
    plan.add_hosts()
    plan.flow_path.parent.mkdir(parents=True, exist_ok=True)
    plan.prepare()
    spec = cluster_flow(load_graph(plan.flow_path))
    assert (spec.shards, spec.shard_key) == (2, "{order_id}")
    assert load_graph(plan.flow_path).name == "drill"


def entry(ms: int, mid: str = "m", epoch: int = 1, peer: str = "peer-a") -> SinkEntry:
    return SinkEntry(mid, epoch, peer, ms)


def test_the_longest_gap_counts_from_the_last_write_before_the_first_fault():
    writes = [entry(ms) for ms in (1000, 1200, 5000, 5100, 6900, 7000)]
    assert max_gap_s(writes, since=1.1) == pytest.approx(3.8)   # 1.2 s -> 5.0 s
    assert max_gap_s(writes, since=5.05) == pytest.approx(1.8)  # from 5.0 s on: 5.1 -> 6.9
    assert max_gap_s([], since=0) == 0.0


def test_time_out_errors_are_measured_against_the_uplink_time_plus_the_join_time_out():
    lab = types.SimpleNamespace(uplink_times=lambda: {"x1": 100_000, "x2": 101_000, "x3": 90_000})
    outputs = {"match.expired": [entry(110_300, "x1"), entry(110_950, "x2"), entry(100_010, "x3")],
               "deliver.done": [entry(105_000, "o1+p1")]}
    # x3's time-out came before the failover at 105 s: not counted.
    figures = timeout_errors(lab, outputs, failover_at=105.0)
    assert figures == {"timeouts_after_failover": 2, "timeout_error_ms_p50": 125, "timeout_error_ms_min": -50,
                       "timeout_error_ms_max": 300}
