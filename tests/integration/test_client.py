"""twinflow.client against real gRPC servers on loopback: batching, which errors are retried,
the overall deadline on a fake clock, failover between addresses, status and handover,
TLS with bearer tokens, and the escalation client."""

from __future__ import annotations

import json
import threading
from concurrent import futures

import grpc
import pytest
import trustme

from twinflow.client import Ack, Client, EscalationClient, PublishError, peer_status, publish, request_handover
from twinflow.cluster.escalation_servicer import Claim, EscalationServicer, StaleEpoch
from twinflow.cluster.grpc_server import PUBLISH_ANSWER_MARGIN_S, AdminServicer, IngestServicer, create_server
from twinflow.grpc_security import GrpcSecurity, TlsFiles

FLOW = "orders"


class FakeClock:
    """monotonic() and sleep() for the client's retries: sleeping moves time on, at once."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Uplink:
    """The Ingest seam: records each batch and the time it was given, fails while ``failures`` > 0."""

    def __init__(self, failures: int = 0):
        self.lock = threading.Lock()
        self.batches: list[list[bytes]] = []
        self.deadlines: list[float] = []
        self.failures = failures
        self.calls = 0
        self.on_call = lambda: None

    def __call__(self, bodies: list[bytes], deadline_s: float) -> list[str]:
        with self.lock:
            self.calls += 1
            self.deadlines.append(deadline_s)
            self.on_call()
            if self.failures > 0:
                self.failures -= 1
                raise ConnectionError("redis at 127.0.0.1:6390 refused the connection")
            start = sum(len(b) for b in self.batches)
            self.batches.append(list(bodies))
            return [f"1700000000000-{start + i}" for i in range(len(bodies))]


class Servers:
    """Starts servers on 127.0.0.1:0 and stops them all at the end."""

    def __init__(self):
        self.started: list[grpc.Server] = []

    def start(self, address: str = "127.0.0.1:0", **services) -> tuple[grpc.Server, str]:
        server, port = create_server(address, **services)
        self.started.append(server)
        return server, f"127.0.0.1:{port}"

    def dead_address(self) -> str:
        """An address where a server was a moment ago: connections are refused."""
        server, address = self.start(ingest=IngestServicer(FLOW, Uplink()))
        server.stop(None).wait()
        return address


@pytest.fixture
def servers():
    s = Servers()
    yield s
    for server in s.started:
        server.stop(None).wait()


@pytest.fixture
def clock():
    return FakeClock()


def make_client(address, clock: FakeClock, **kw) -> Client:
    # jitter 1.0: every pause is the full back-off, so the expected pauses are exact.
    return Client(address, FLOW, sleep=clock.sleep, monotonic=clock.monotonic, jitter=lambda: 1.0, **kw)


# ---- publishing ------------------------------------------------------------


def test_a_large_publish_goes_in_batches_in_order(servers, clock):
    uplink = Uplink()
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink))
    docs = [{"id": f"m{i}", "seq": i} for i in range(2500)]

    with make_client(address, clock) as client:
        positions = client.publish(docs, batch_size=1000)

    assert [len(b) for b in uplink.batches] == [1000, 1000, 500]
    assert positions == [f"1700000000000-{i}" for i in range(2500)]
    assert [json.loads(body) for batch in uplink.batches for body in batch] == docs
    assert clock.sleeps == []


def test_batches_are_also_cut_by_bytes(servers, clock):
    uplink = Uplink()
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink))

    with make_client(address, clock) as client:
        client.publish([b"123456", b"123456", b"1234", b"x" * 30], batch_size=100, max_batch_bytes=10)

    # 6 + 6 > 10 starts a new batch; a body over the limit goes alone.
    assert uplink.batches == [[b"123456"], [b"123456", b"1234"], [b"x" * 30]]


def test_resource_exhausted_is_retried_after_a_pause_and_then_succeeds(servers, clock):
    inside, release = threading.Event(), threading.Event()
    written: list[list[bytes]] = []

    def uplink(bodies: list[bytes], deadline_s: float) -> list[str]:
        if bodies == [b'{"id": "held"}']:
            inside.set()
            assert release.wait(10.0), "the test never released the held publish"
        written.append(bodies)
        return [f"1700000000000-{len(written) - 1}"]

    # ingest_limit=1: while one publish holds the slot the peer refuses the next one.
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink), ingest_limit=1)
    other = futures.ThreadPoolExecutor(1)
    held = other.submit(publish, address, FLOW, [b'{"id": "held"}'], 10.0)
    assert inside.wait(5.0), "the first publish never reached the uplink"

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        release.set()  # the peer's slot frees during the pause
        held.result(5.0)

    client = Client(address, FLOW, sleep=sleep, monotonic=clock.monotonic, jitter=lambda: 1.0)
    try:
        positions = client.publish([b'{"id": "m1"}'])
    finally:
        client.close()
        release.set()
        other.shutdown(wait=True)

    assert clock.sleeps == [0.05]  # refused once, retried once
    assert held.result() == ["1700000000000-0"]
    assert positions == ["1700000000000-1"]
    assert written == [[b'{"id": "held"}'], [b'{"id": "m1"}']]


def test_unavailable_is_retried_with_a_doubling_back_off_by_default(servers, clock):
    uplink = Uplink(failures=2)
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink))

    with make_client(address, clock) as client:
        positions = client.publish([b'{"id": "m1"}'])

    assert positions == ["1700000000000-0"]
    assert clock.sleeps == [0.05, 0.1]
    assert uplink.calls == 3


def test_unavailable_without_retry_raises_at_once_with_what_was_written(servers, clock):
    uplink = Uplink()
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink))

    with make_client(address, clock, retry_unavailable=False) as client:
        assert client.publish([b"{}"] * 2, batch_size=2) == ["1700000000000-0", "1700000000000-1"]
        uplink.failures = 1
        with pytest.raises(PublishError) as failed:
            client.publish([b"{}"] * 5, batch_size=2)

    err = failed.value
    assert isinstance(err, grpc.RpcError)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "refused the connection" in err.details()
    assert err.positions == [] and err.unconfirmed == 5 and err.attempts == 1
    assert clock.sleeps == []

    uplink.calls = 0
    with make_client(address, clock, retry_unavailable=False) as client:
        uplink.on_call = lambda: setattr(uplink, "failures", 1 if uplink.calls == 2 else 0)
        with pytest.raises(PublishError) as failed:
            client.publish([b"{}"] * 5, batch_size=2)

    # The first batch was written; the second failed; the third was never sent.
    assert failed.value.positions == ["1700000000000-2", "1700000000000-3"]
    assert failed.value.unconfirmed == 3
    assert uplink.calls == 2


@pytest.mark.parametrize(
    "flow, count, detail",
    [("payments", 1, "wrong flow 'payments'"), (FLOW, 4, "at most 3")],
)
def test_invalid_argument_is_not_retried(servers, clock, flow, count, detail):
    uplink = Uplink()
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink, max_batch=3))

    client = Client(address, flow, sleep=clock.sleep, monotonic=clock.monotonic)
    with client, pytest.raises(PublishError) as failed:
        client.publish([b"{}"] * count, batch_size=10)

    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in failed.value.details()
    assert failed.value.attempts == 1 and clock.sleeps == []
    assert uplink.calls == 0


def test_the_overall_deadline_bounds_the_retries_and_each_rpc(servers, clock):
    uplink = Uplink(failures=1_000)
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink))
    began = clock.now

    with make_client(address, clock) as client, pytest.raises(PublishError) as failed:
        client.publish([b"{}"], deadline_s=1.0)

    # Pauses 0.05 + 0.1 + 0.2 + 0.4 = 0.75 s; the next (0.8 s) would pass the deadline.
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.4]
    assert clock.now - began < 1.0
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE and failed.value.attempts == 5
    assert "deadline" in failed.value.details()
    # Each RPC's gRPC deadline was what was left of the 1 s; the peer gives its uplink that less its margin.
    left = [1.0, 0.95, 0.85, 0.65, 0.25]
    assert len(uplink.deadlines) == 5
    for seen, remaining in zip(uplink.deadlines, left):
        assert seen <= max(0.0, remaining - PUBLISH_ANSWER_MARGIN_S) + 0.05


def test_the_deadline_covers_every_batch(servers, clock):
    uplink = Uplink()
    uplink.on_call = lambda: setattr(clock, "now", clock.now + 0.6)  # each write takes 0.6 s
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink))

    with make_client(address, clock) as client, pytest.raises(PublishError) as failed:
        client.publish([b"{}"] * 3, batch_size=1, deadline_s=1.0)

    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert failed.value.positions == ["1700000000000-0", "1700000000000-1"]
    assert failed.value.unconfirmed == 1
    assert uplink.calls == 2


def test_a_publish_fails_over_to_the_next_address_at_once(servers, clock):
    uplink = Uplink()
    _, live = servers.start(ingest=IngestServicer(FLOW, uplink),
                            admin=AdminServicer(lambda: {"peer_id": "b", "role": "master"}, lambda t: {}))
    dead = servers.dead_address()

    with make_client([dead, live], clock) as client:
        assert client.publish([b'{"id": "m1"}', b'{"id": "m2"}'], batch_size=1) == [
            "1700000000000-0", "1700000000000-1"]
        assert client.status()["peer_id"] == "b"  # the first peer that answers

    assert clock.sleeps == []
    assert uplink.batches == [[b'{"id": "m1"}'], [b'{"id": "m2"}']]


def test_with_every_address_down_it_pauses_once_per_round(servers, clock):
    dead = [servers.dead_address(), servers.dead_address()]

    with make_client(dead, clock) as client, pytest.raises(PublishError) as failed:
        client.publish([b"{}"], deadline_s=0.2)

    # Two attempts, 0.05 s; two, 0.1 s; two, and the next 0.2 s pause would pass the deadline.
    assert clock.sleeps == [0.05, 0.1]
    assert failed.value.attempts == 6
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


# ---- status and handover ---------------------------------------------------


class FakePeer:
    def __init__(self, peer_id: str, role: str):
        self.peer_id, self.role = peer_id, role
        self.handovers: list[float] = []

    def status(self) -> dict:
        return {"flow": FLOW, "peer_id": self.peer_id, "role": self.role, "epoch": 7}

    def handover(self, timeout_s: float) -> dict:
        self.handovers.append(timeout_s)
        if self.role != "master":
            return {"ok": False, "reason": "not master"}
        return {"ok": True, "new_master": "a", "seconds": 0.02}


def test_status_statuses_and_handover(servers, clock):
    worker, master = FakePeer("a", "worker"), FakePeer("b", "master")
    _, worker_address = servers.start(admin=AdminServicer(worker.status, worker.handover))
    _, master_address = servers.start(admin=AdminServicer(master.status, master.handover))
    dead = servers.dead_address()

    with make_client([worker_address, master_address, dead], clock) as client:
        assert client.status()["peer_id"] == "a"
        assert client.status(master_address)["role"] == "master"
        statuses = client.statuses(timeout_s=2.0)
        # The handover goes to the peer whose status says master, not to the first address.
        reply = client.handover(timeout_s=2.5)

    assert statuses[worker_address]["role"] == "worker" and statuses[worker_address]["uplink_lag"] == 0
    assert statuses[master_address]["epoch"] == 7
    assert isinstance(statuses[dead], grpc.RpcError) and statuses[dead].code() == grpc.StatusCode.UNAVAILABLE
    assert reply == {"ok": True, "new_master": "a", "seconds": 0.02, "reason": ""}
    assert master.handovers == [2.5] and worker.handovers == []

    with make_client(worker_address, clock) as client:
        assert client.handover(timeout_s=1.0) == {"ok": False, "new_master": "", "seconds": 0.0,
                                                  "reason": "not master"}
    with make_client(dead, clock) as client, pytest.raises(grpc.RpcError) as failed:
        client.status(timeout_s=2.0)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_one_call_functions_still_work(servers):
    uplink, peer = Uplink(), FakePeer("a", "master")
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink), admin=AdminServicer(peer.status, peer.handover))

    assert publish(address, FLOW, [b'{"id": "m1"}']) == ["1700000000000-0"]
    assert peer_status(address)["peer_id"] == "a"
    assert request_handover(address, timeout_s=1.5)["ok"] is True
    assert peer.handovers == [1.5]


# ---- TLS and tokens ----------------------------------------------------------


TOKENS = {"ingest": "ingest-token", "escalation": "escalation-token", "admin": "admin-token"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA and a server certificate for 127.0.0.1, as PEM files."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("pki")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "node-key.pem"))
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(d / "node.pem"), append=True)
    return d


def test_tls_with_the_right_token_works_and_wrong_tokens_are_refused(servers, clock, pki):
    uplink, peer = Uplink(), FakePeer("a", "master")
    server_security = GrpcSecurity(tls=TlsFiles(cert=str(pki / "node.pem"), key=str(pki / "node-key.pem")),
                                   tokens=TOKENS)
    _, address = servers.start(ingest=IngestServicer(FLOW, uplink), admin=AdminServicer(peer.status, peer.handover),
                               security=server_security)
    tls = TlsFiles(ca=str(pki / "ca.pem"))

    with make_client(address, clock, security=GrpcSecurity(tls=tls, tokens=TOKENS)) as client:
        assert client.publish([b'{"id": "m1"}']) == ["1700000000000-0"]
        assert client.status()["peer_id"] == "a"
    assert peer_status(address, security=GrpcSecurity(tls=tls, tokens={"admin": "admin-token"}))["role"] == "master"

    wrong = GrpcSecurity(tls=tls, tokens={"ingest": "not-the-token"})
    with make_client(address, clock, security=wrong) as client, pytest.raises(PublishError) as refused:
        client.publish([b'{"id": "m2"}'])
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.attempts == 1 and clock.sleeps == []

    # A valid token of another scope: the ingest token sent to the Admin service.
    ingest_only = GrpcSecurity(tls=tls, tokens={"ingest": "ingest-token", "admin": "ingest-token"})
    with make_client(address, clock, security=ingest_only) as client, pytest.raises(grpc.RpcError) as denied:
        client.handover(timeout_s=1.0)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert peer.handovers == []
    assert uplink.batches == [[b'{"id": "m1"}']]


# ---- escalation ------------------------------------------------------------


class Claims:
    """The worker's claim logic: records batches; refuses epochs below ``newest``; can hold a batch."""

    def __init__(self):
        self.batches: list[tuple[int, list]] = []
        self.newest = 0
        self.hold = threading.Event()
        self.hold.set()

    def __call__(self, epoch: int, claims) -> int:
        assert self.hold.wait(10.0), "the test never released the batch"
        if epoch < self.newest:
            raise StaleEpoch(f"newest is {self.newest}")
        self.newest = epoch
        self.batches.append((epoch, list(claims)))
        return len(claims)


def claims(start: int, n: int) -> list[Claim]:
    return [Claim(f"m{i}", str(1_700_000_000_000 + i), f"{1_700_000_000_000 + i}-0", "all") for i in range(start, start + n)]


def test_escalation_client_sends_batches_acked_in_order(servers):
    worker = Claims()
    server, address = servers.start(escalation=EscalationServicer(FLOW, worker))

    with EscalationClient(address, FLOW, "billing") as esc:
        first = esc.send(7, claims(0, 3))
        second = esc.send(8, claims(3, 2))
        stale = esc.send(7, claims(5, 1))
        after = esc.send(8, claims(6, 1))

    assert first == Ack(seq=1, accepted=True, claimed=3, reason="")
    assert second == Ack(seq=2, accepted=True, claimed=2, reason="")
    assert stale.seq == 3 and not stale.accepted and stale.reason.startswith("stale epoch 7")
    assert after == Ack(seq=4, accepted=True, claimed=1, reason="")  # a refusal leaves the stream open
    assert worker.batches == [(7, claims(0, 3)), (8, claims(3, 2)), (8, claims(6, 1))]

    with EscalationClient(address, "payments", "billing") as esc:
        refused = esc.send(8, claims(7, 1))
    assert not refused.accepted and "wrong flow 'payments'" in refused.reason


def test_escalation_client_reopens_the_stream_after_a_failure_or_a_time_out(servers):
    worker = Claims()
    server, address = servers.start(escalation=EscalationServicer(FLOW, worker))
    esc = EscalationClient(address, FLOW, "billing")
    try:
        assert esc.send(7, claims(0, 1)).accepted
        server.stop(None).wait()
        with pytest.raises(grpc.RpcError):
            esc.send(7, claims(1, 1))

        servers.start(address, escalation=EscalationServicer(FLOW, worker))  # the same port again
        assert esc.send(7, claims(2, 1)) == Ack(seq=1, accepted=True, claimed=1, reason="")  # a new stream

        worker.hold.clear()
        with pytest.raises(TimeoutError, match="batch 2"):
            esc.send(7, claims(3, 1), timeout_s=0.2)
        worker.hold.set()
        assert esc.send(7, claims(4, 1)).seq == 1
    finally:
        worker.hold.set()
        esc.close()
    assert [c for _, batch in worker.batches for c in batch][-1] == claims(4, 1)[0]
    with pytest.raises(ValueError, match="closed"):
        esc.send(7, claims(5, 1))
