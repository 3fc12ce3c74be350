"""The escalation client behind :class:`twinflow.client.EscalationClient` (the public module
exposes it): one Escalate stream to a peer, a batch of claims at a time, each waited for
until its ack.

It holds :class:`EscalationClient`, its :class:`Ack` and the stream it keeps (``_Stream``:
the requests queue and the thread that reads the acks). Under failure it promises no more
than it says: a send that fails or times out raises and drops the stream (the next send opens
a new one), and the batch may or may not have been processed; claiming is idempotent on the
worker, so the caller sends it again. It never retries, buffers or reconnects by itself.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import grpc

from twinflow.grpc_keepalive import CHANNEL_OPTIONS as ESCALATION_CHANNEL_OPTIONS
from twinflow.grpc_security import NO_SECURITY, GrpcSecurity
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Ack:
    """A worker's answer to one escalation batch (the wire's EscalationAck)."""

    seq: int
    accepted: bool   # False: refused (stale epoch, wrong flow, an error in its claim logic); see reason
    claimed: int     # how many baked messages the batch released
    reason: str


_END = object()  # ends a request stream, or marks the end of an ack stream


class _Stream:
    """One Escalate call: its channel, the requests queue, and the acks a thread reads from it."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.requests: queue.Queue = queue.Queue()
        self.acks: queue.Queue = queue.Queue()
        self.next_seq = 1
        self.call = pb_grpc.EscalationStub(channel).Escalate(iter(self.requests.get, _END))
        self.reader = threading.Thread(target=self._read, name="escalation-client-acks", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for ack in self.call:
                self.acks.put(ack)
        except grpc.RpcError as exc:
            self.acks.put(exc)
        self.acks.put(_END)

    def close(self) -> None:
        self.requests.put(_END)
        self.call.cancel()
        self.channel.close()
        self.reader.join(2.0)


class EscalationClient:
    """Reports processed messages to one peer of a flow over an Escalate stream, a batch at a time.

    :meth:`send` puts one batch of claims (message id, key as text, uplink
    position) on the stream and waits for its ack. The stream is opened on
    the first send and kept; a stream that failed or a send that timed out
    closes it, and the next send opens a new one (its batches are numbered
    from 1 again). After an error or a time-out the batch may or may not have
    been processed; claiming is idempotent on the worker, so send it again.
    Unlike the peer's ``EscalationSender`` it does not buffer, batch or
    reconnect by itself. ``security`` needs the ``escalation`` scope's token
    where the peer asks for tokens.

    >>> from twinflow.cluster.escalation_servicer import EscalationServicer
    >>> from twinflow.cluster.grpc_server import create_server
    >>> got = []
    >>> server, port = create_server("127.0.0.1:0", escalation=EscalationServicer(
    ...     "orders", lambda epoch, claims: got.extend(claims) or len(claims)))
    >>> with EscalationClient(f"127.0.0.1:{port}", "orders", "billing") as esc:
    ...     esc.send(7, [("o1", "1700000000000", "1700000000000-0")])
    Ack(seq=1, accepted=True, claimed=1, reason='')
    >>> got
    [Claim(ident='o1', key='1700000000000', position='1700000000000-0', ruleset='')]
    >>> _ = server.stop(None).wait()
    """

    def __init__(self, address: str, flow: str, from_node: str, security: GrpcSecurity = NO_SECURITY):
        self.address, self.flow, self.from_node, self.security = address, flow, from_node, security
        self._lock = threading.Lock()  # one batch at a time
        self._stream: _Stream | None = None
        self._closed = False

    def send(self, epoch: int, claims: list[tuple[str, ...]], timeout_s: float = 5.0) -> Ack:
        """Send one batch of ``claims`` at ``epoch``; return its ack. A claim is (claim ID, key
        as text, uplink position) and, optionally, the claim pair's ruleset it releases in
        (without one: every baking group).

        Raises ``grpc.RpcError`` when the stream fails (``UNAVAILABLE``: the
        peer is down; ``UNAUTHENTICATED``/``PERMISSION_DENIED``: the token)
        and ``TimeoutError`` when no ack arrives within ``timeout_s``.
        """
        with self._lock:
            if self._closed:
                raise ValueError("the escalation client is closed")
            if self._stream is None:
                self._stream = _Stream(self.security.channel(self.address, "escalation", ESCALATION_CHANNEL_OPTIONS))
            stream = self._stream
            seq = stream.next_seq
            stream.next_seq += 1
            batch = pb.EscalationBatch(flow=self.flow, from_node=self.from_node, epoch=epoch, seq=seq)
            for claim in claims:
                batch.claims.add(id=claim[0], key=claim[1], position=claim[2], rule=claim[3] if len(claim) > 3 else "")
            stream.requests.put(batch)
            try:
                ack = stream.acks.get(timeout=timeout_s)
            except queue.Empty:
                self._drop_stream()
                raise TimeoutError(f"no ack for escalation batch {seq} from {self.address} "
                                   f"within {timeout_s} s; it may or may not have been processed") from None
            if isinstance(ack, pb.EscalationAck) and ack.seq == seq:
                return Ack(seq=ack.seq, accepted=ack.accepted, claimed=ack.claimed, reason=ack.reason)
            self._drop_stream()
            if isinstance(ack, grpc.RpcError):
                raise ack
            if ack is _END:
                raise ConnectionError(f"{self.address} ended the escalation stream before acking batch {seq}")
            raise ConnectionError(f"{self.address} acked batch {ack.seq}, expected {seq}")

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    def close(self) -> None:
        """Close the stream, if one is open; a send after this raises ``ValueError``."""
        with self._lock:
            self._closed = True
            self._drop_stream()

    def __enter__(self) -> "EscalationClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
