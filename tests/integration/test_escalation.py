"""Escalation over real gRPC servers on loopback: delivery, refusal, restarts, dead peers, bounds."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import wait_until
from twinflow.cluster.escalation import MAX_IN_FLIGHT, EscalationSender
from twinflow.cluster.escalation_servicer import Claim, EscalationServicer, StaleEpoch
from twinflow.cluster.grpc_server import create_server
from twinflow.testing.servers import free_port

FLOW = "orders"


def make_claims(start: int, n: int) -> list[Claim]:
    return [Claim(f"m{i}", str(1_700_000_000_000 + i), f"{1_700_000_000_000 + i}-0", "all") for i in range(start, start + n)]


def send_in_chunks(sender: EscalationSender, claims, chunk: int = 100) -> None:
    for i in range(0, len(claims), chunk):
        sender.send(claims[i : i + chunk])


class Recorder:
    """The worker's claim logic as a seam: records every claim and the epoch it came with."""

    def __init__(self, delay_s: float = 0.0):
        self.lock = threading.Lock()
        self.claims: list[tuple[str, str, str]] = []
        self.epochs: list[int] = []
        self.delay_s = delay_s

    def __call__(self, epoch: int, claims) -> int:
        time.sleep(self.delay_s)
        with self.lock:
            self.claims.extend(claims)
            self.epochs.append(epoch)
        return len(claims)

    def count(self) -> int:
        with self.lock:
            return len(self.claims)


@pytest.fixture
def servers():
    """Start gRPC servers on demand; all are stopped after the test."""
    started = []

    def start(on_claims, address: str = "127.0.0.1:0", flow: str = FLOW):
        server, port = create_server(address, escalation=EscalationServicer(flow, on_claims))
        started.append(server)
        return server, port

    yield start
    for server in started:
        server.stop(None).wait()


@pytest.fixture
def senders():
    """Make senders; all are stopped after the test."""
    made = []

    def make(targets, epoch=lambda: 7, **kw):
        sender = EscalationSender(FLOW, "node-a", epoch, targets, **kw)
        made.append(sender)
        return sender

    yield make
    for sender in made:
        sender.stop()


def balanced(stats: dict) -> bool:
    return stats["enqueued"] == stats["acked"] + stats["refused"] + stats["dropped"] + stats["pending"]


def test_claims_arrive_once_in_order(servers, senders):
    recorder = Recorder()
    _, port = servers(recorder)
    sender = senders(lambda: {"node-b": f"127.0.0.1:{port}"})
    claims = make_claims(0, 20_000)

    send_in_chunks(sender, claims)

    assert sender.flush(10.0)
    assert recorder.claims == claims
    assert set(recorder.epochs) == {7}
    stats = sender.stats()
    counts = (stats["acked"], stats["claimed"], stats["pending"], stats["dropped"], stats["refused"])
    assert counts == (20_000, 20_000, 0, 0, 0)
    assert stats["targets"]["node-b"]["streams"] == 1
    assert balanced(stats)


def test_each_target_gets_only_the_claims_of_messages_it_has_read(servers, senders):
    b, c = Recorder(), Recorder()
    _, port_b = servers(b)
    _, port_c = servers(c)
    sender = senders(lambda: {"node-b": f"127.0.0.1:{port_b}", "node-c": f"127.0.0.1:{port_c}"})
    claims = make_claims(0, 10)
    # node-b has handled the uplink up to the fourth message's position; node-c's is unknown.
    sender.send(claims, {"node-b": claims[3][2], "node-c": None})
    sender.send(make_claims(10, 5), {"node-b": claims[3][2]})  # none of these read by node-b
    assert sender.flush(10.0)
    assert b.claims == claims[:4] and c.claims == claims + make_claims(10, 5)
    stats = sender.stats()
    assert stats["targets"]["node-b"]["unread"] == 11 and stats["targets"]["node-c"]["unread"] == 0
    assert balanced(stats) and stats["acked"] == 4 + 15


def test_stale_epoch_batches_are_refused_and_dropped(servers, senders):
    newest = 7
    recorder = Recorder()

    def on_claims(epoch, claims):
        if epoch < newest:
            raise StaleEpoch(f"newest epoch is {newest}")
        return recorder(epoch, claims)

    _, port = servers(on_claims)
    epoch = [5]
    sender = senders(lambda: {"node-b": f"127.0.0.1:{port}"}, epoch=lambda: epoch[0])

    send_in_chunks(sender, make_claims(0, 1_000))
    assert sender.flush(5.0)
    stats = sender.stats()
    assert (stats["refused"], stats["acked"], stats["pending"]) == (1_000, 0, 0)
    assert recorder.claims == []

    epoch[0] = 7
    later = make_claims(1_000, 1_000)
    send_in_chunks(sender, later)
    assert sender.flush(5.0)
    assert recorder.claims == later
    stats = sender.stats()
    assert (stats["refused"], stats["acked"]) == (1_000, 1_000)
    assert stats["targets"]["node-b"]["streams"] == 1  # refusals never broke the stream
    assert balanced(stats)


def test_wrong_flow_and_failing_claim_logic_are_refused_without_breaking_the_stream(servers, senders, caplog):
    calls = []

    def broken(epoch, claims):
        calls.append(len(claims))
        raise RuntimeError("claim store unreachable")

    _, port_broken = servers(broken)
    _, port_other = servers(Recorder(), flow="payments")
    sender = senders(lambda: {"broken": f"127.0.0.1:{port_broken}", "other": f"127.0.0.1:{port_other}"})

    with caplog.at_level(logging.WARNING, logger="twinflow.escalation"):
        for _ in range(3):
            sender.send(make_claims(0, 10))
            assert sender.flush(5.0)

    per_target = sender.stats()["targets"]
    for name in ("broken", "other"):
        assert (per_target[name]["refused"], per_target[name]["acked"], per_target[name]["streams"]) == (30, 0, 1)
    assert sum(calls) == 30
    assert "claim store unreachable" in caplog.text
    assert "wrong flow 'orders'" in caplog.text


def test_target_restart_on_the_same_port_loses_no_claim(servers, senders):
    batch_max = 500
    before = Recorder(delay_s=0.005)  # slow enough that the stop lands mid-stream
    server, port = servers(before)
    sender = senders(lambda: {"node-b": f"127.0.0.1:{port}"}, batch_max=batch_max, reconnect_backoff_s=0.05)
    first, second = make_claims(0, 20_000), make_claims(20_000, 5_000)

    send_in_chunks(sender, first)
    wait_until(lambda: before.count() >= 2_000, 5.0, interval_s=0.005, what="first batches delivered")
    server.stop(None).wait()
    wait_until(lambda: not sender.stats()["targets"]["node-b"]["connected"], 5.0, what="stream seen broken")
    send_in_chunks(sender, second)  # while the target is down
    assert before.count() < len(first)

    after = Recorder()
    _, same_port = servers(after, address=f"127.0.0.1:{port}")
    assert same_port == port

    assert sender.flush(10.0)
    everything = first + second
    assert set(before.claims) | set(after.claims) == set(everything)
    # Each server saw a gap-free run in order; the overlap is what was sent but not acked.
    assert before.claims == everything[: len(before.claims)]
    duplicates = len(before.claims) + len(after.claims) - len(everything)
    assert 0 <= duplicates <= MAX_IN_FLIGHT * batch_max
    assert after.claims == everything[len(before.claims) - duplicates :]
    stats = sender.stats()
    assert stats["acked"] == len(everything)
    assert stats["targets"]["node-b"]["streams"] == 2
    assert balanced(stats)


SERVER_SCRIPT = """
import os, time
from twinflow.cluster.escalation_servicer import EscalationServicer
from twinflow.cluster.grpc_server import create_server
server, port = create_server("127.0.0.1:0", escalation=EscalationServicer("orders", lambda epoch, claims: len(claims)))
print(port, flush=True)
time.sleep(60)
"""


def test_frozen_target_is_noticed_by_keepalive_and_caught_up_after(senders):
    # A stopped process keeps its socket open and the kernel still ACKs:
    # only keepalive pings can tell it is dead.
    proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        sender = senders(lambda: {"node-b": f"127.0.0.1:{port}"}, reconnect_backoff_s=0.05)
        sender.send(make_claims(0, 10))
        assert sender.flush(5.0)

        proc.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        sender.send(make_claims(10, 10))
        wait_until(lambda: not sender.stats()["targets"]["node-b"]["connected"], 5.0, what="dead peer noticed")
        print(f"\nfrozen target noticed after {time.monotonic() - frozen_at:.2f} s")

        proc.send_signal(signal.SIGCONT)
        assert sender.flush(5.0)
        stats = sender.stats()
        assert (stats["acked"], stats["pending"]) == (20, 0)
        assert stats["targets"]["node-b"]["streams"] == 2
    finally:
        proc.kill()
        proc.wait()


def test_buffer_is_bounded_and_drops_the_oldest(servers, senders):
    port = free_port()  # nothing listens here yet
    sender = senders(lambda: {"node-b": f"127.0.0.1:{port}"}, max_buffer=1_000, reconnect_backoff_s=0.05)
    claims = make_claims(0, 12_500)

    send_in_chunks(sender, claims[:2_500])
    stats = sender.stats()
    assert (stats["dropped"], stats["pending"]) == (1_500, 1_000)

    for i in range(2_500, len(claims), 1_000):
        send_in_chunks(sender, claims[i : i + 1_000])
        assert sender.stats()["pending"] == 1_000  # memory stays bounded however much comes in
    assert sender.stats()["dropped"] == 11_500

    recorder = Recorder()
    servers(recorder, address=f"127.0.0.1:{port}")
    assert sender.flush(10.0)
    assert recorder.claims == claims[-1_000:]
    assert balanced(sender.stats())


def test_targets_are_reread_as_nodes_come_and_go(servers, senders):
    recorder = Recorder()
    _, port = servers(recorder)
    targets: dict[str, str] = {}
    sender = senders(lambda: dict(targets))

    sender.send(make_claims(0, 10))  # no target yet: nobody to escalate to
    assert sender.stats()["targets"] == {}

    targets["node-b"] = f"127.0.0.1:{port}"
    wait_until(lambda: sender.stats()["targets"].get("node-b", {}).get("connected"), 5.0, what="new target joined")
    sender.send(make_claims(10, 10))
    assert sender.flush(5.0)
    assert recorder.claims == make_claims(10, 10)

    targets.clear()
    wait_until(lambda: sender.stats()["targets"] == {}, 5.0, what="target left")
