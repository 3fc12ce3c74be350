"""The short lab: two peers, Redis and ZooKeeper on hosts of their own (network namespaces on a
private bridge), a client host publishing over mutual TLS; the master's host dies mid-stream
(every process of it SIGKILLed at once), the other peer takes over, and every message leaves
the flow exactly once, as the one checker judges it.

Runs as root only (network namespaces): skipped elsewhere, with the reason. The namespaces'
prefix carries this process's PID, so a lab test on another xdist worker never meets them.
"""

from __future__ import annotations

import errno
import json
import socket
import ssl
import urllib.request

import pytest

from tests.conftest import wait_until
from tests.lab.conftest import lab_prefix
from twinflow.testing.checker import check, check_outputs, failover_seconds
from twinflow_dev.lab import Lab
from twinflow_dev.lab_network import connect_in, entered, ns_inode, pids_in

pytestmark = [pytest.mark.cluster, pytest.mark.lab, pytest.mark.timeout(170)]

MESSAGES = 2000
RATE = 200.0          # messages per second: 10 s of publishing
KILL_AFTER = 300      # the master has delivered this many when its host dies


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path / "lab", short=True, prefix=lab_prefix("tft"))
    try:
        lab.up()
        yield lab
    finally:
        lab.down()
        left = [ns for ns in [lab.state.hub, *(h.ns for h in lab.state.hosts)] if ns_inode(ns) is not None]
        assert left == [], f"lab down left namespaces {left}"


def metrics_in(lab, host: str) -> str:
    """The peer's Prometheus page, fetched inside its host (it listens on 127.0.0.1:9464 there)."""
    with connect_in(lab.state.host(host).ns, "127.0.0.1", 9464, timeout_s=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        reply = b""
        while len(reply) < 1 << 22 and (chunk := sock.recv(65536)):
            reply += chunk
    return reply.decode(errors="replace")


def acked(path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_the_master_host_dies_and_the_other_peer_delivers_every_message(lab, tmp_path, record_property):
    record_property("lab_up_s", lab.state.info["up_s"])
    # Nothing leaves the lab: no route out of a host.
    with entered(lab.client_ns), pytest.raises(OSError) as no_route:
        socket.create_connection(("192.0.2.1", 80), timeout=2)
    assert no_route.value.errno == errno.ENETUNREACH

    old = lab.master()
    other = next(p for p in ("peer-a", "peer-b") if p != old)
    # Every peer listens on 0.0.0.0 and is known by the name it advertises: in its status (what
    # `twinflow status` and the clients read) and in its metrics' labels.
    statuses = lab.peer_statuses()
    for p in ("peer-a", "peer-b"):
        assert statuses[p]["grpc_address"] == f"{p}.lab:7070"
        page = metrics_in(lab, p)
        master_line = next(line for line in page.splitlines() if line.startswith("twinflow_is_master"))
        assert f'peer="{p}"' in master_line and master_line.endswith(" 1.0" if p == old else " 0.0"), master_line
    old_epoch = int(lab.peer_statuses()[old]["epoch"])
    sent_file = tmp_path / "acked.txt"
    publisher = lab.publisher(MESSAGES, RATE, sent_file)

    wait_until(lambda: sum(e.peer == old for e in lab.outputs()["deliver.done"]) >= KILL_AFTER, 60, 0.2,
               what=f"{old}, the master, delivering {KILL_AFTER} joined pairs")
    killed_at = lab.kill_host(old)
    sent_before_kill = len(acked(sent_file))
    assert pids_in(lab.state.host(old).ns) == []  # every process of the host, its Spark JVM too

    wait_until(lambda: lab.master() == other, 30, 0.1, what=f"{other} becoming master")
    assert lab.wait_exit(publisher, 60) == 0, open(publisher.log).read()[-3000:]
    sent = acked(sent_file)
    assert len(sent) == MESSAGES and sent_before_kill < MESSAGES  # it kept publishing, to the survivor
    # Every sent message out of the flow: a lone order leaves through `expired` 10 s after it came.
    wait_until(lambda: check_outputs(lab.outputs(), sent).delivered == len(sent), 60, 0.5,
               what="every sent message out of the flow")

    outputs = lab.outputs()
    report = check(outputs, sent, faults=[killed_at])
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0), report
    assert report.promises_kept, report
    assert {e.peer for e in outputs["deliver.done"]} == {old, other}
    operators_on_mutual_tls(lab, other)
    console_of_the_survivor(lab, other, old_epoch)
    failover_s = failover_seconds(lab.sink_entries(), old_epoch, killed_at)
    assert failover_s is not None and failover_s < 10.0
    record_property("failover_s", round(failover_s, 2))
    print(f"lab up {lab.state.info['up_s']} s; {old} killed after {sent_before_kill} sent; failover "
          f"{failover_s:.2f} s; rto {report.rto_s} s; outlinks "
          f"{ {k: len(v) for k, v in outputs.items() if v} }")


def console_of_the_survivor(lab, master: str, old_epoch: int) -> None:
    """The survivor's console, forwarded to this machine (``twinflow lab console``): HTTPS with its
    certificate (it names localhost), the lab's admin token; the new master and its promotion."""
    forward = lab.console(master)
    try:
        https = ssl.create_default_context(cafile=str(lab.plan.secrets / "ca.pem"))
        token = (lab.plan.secrets / "admin.token").read_text().split()[0]
        request = urllib.request.Request(f"https://localhost:{forward.port}/console/api/snapshot",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=15, context=https) as reply:
            snap = json.load(reply)
    finally:
        forward.stop()
    assert [(p["peer_id"], p["role"]) for p in snap["peers"]] == [(master, "master")], snap["peers"]
    promoted = next(f for f in snap["failovers"] if f["peer"] == master and f["epoch"] > old_epoch)
    assert all(phase["at"] is not None for phase in promoted["phases"]), promoted


def operators_on_mutual_tls(lab, master: str) -> None:
    """The operator commands from the client host, over the peers' mutual TLS with the client's
    own certificate and the admin token (TWINFLOW_* variables), never a peer's key."""
    flow = str(lab.plan.flow_path)
    peer = f"{master}.lab:7070"
    # status asks Redis first: one where nothing listens makes it ask the peer over gRPC.
    status = lab.operator("status", flow, "--json", "--redis", "redis://127.0.0.1:1/0", "--peer", peer)
    assert status.returncode == 0, status.stderr[-2000:]
    assert any(row["role"] == "master" and row["peer_id"] == master for row in json.loads(status.stdout)["peers"])
    listed = lab.operator("failures", "list", flow, "--peer", peer, "--status", "ANY", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["flow"] == lab.plan.flow, listed.stderr[-2000:]
    resumed = lab.operator("resume", flow, "--peer", peer)
    assert resumed.returncode == 0 and "is not suspended: nothing to resume" in resumed.stdout, resumed.stderr
    # Without the client's certificate the peers refuse the handshake: one line, exit 3.
    bare = lab.operator("resume", flow, "--peer", peer, certificate=False)
    assert bare.returncode == 3 and "Traceback" not in bare.stderr, bare.stderr[-2000:]
