"""A Python client for services that talk to a twinflow cluster over gRPC.

:class:`Client` publishes message bodies into a flow's uplink through the
Ingest service of any of the flow's peers (and reads a publisher's error
notices there), and asks peers for their status, for a graceful handover and
for the audit of failed messages: list, resubmit, discard (the Admin service). :class:`EscalationClient`
reports processed messages to a flow's worker over the Escalation stream,
one acknowledged batch at a time. Both take a :class:`~twinflow.grpc_security.GrpcSecurity`
(TLS files and the bearer token of each scope: ``ingest`` for publishing,
``admin`` for handover and the audit's actions, ``read`` or else ``admin`` for
status and the audit's listing, ``escalation`` for claims); the default,
``NO_SECURITY``, is plain gRPC, as a peer on loopback serves by default.

What :meth:`Client.publish` promises under failure (at-least-once):

- It returns only when every body is written, with the bodies' uplink
  positions in order; otherwise it raises :class:`PublishError`, which says
  which leading bodies were written (``positions``) and how many were not
  confirmed (``unconfirmed``: some of them may have been written).
- ``RESOURCE_EXHAUSTED`` (the peer is at its limit of concurrent publishes
  and refused before writing anything) is always retried after a back-off.
- ``UNAVAILABLE`` (the peer, or its Redis, is down) is retried too, on the
  next address when there are several, unless ``retry_unavailable=False``.
  A peer may answer ``UNAVAILABLE`` after Redis wrote some of the batch, so a
  retry can write those entries twice. The flow delivers each message ID
  once (the ID cache and the processed mark skip a repeated ID), so a
  duplicate *uplink entry* is never a duplicate *delivery*, provided every
  body carries the flow's message ID field. Pass ``retry_unavailable=False``
  where a duplicate uplink entry is not acceptable; then decide yourself.
- Nothing else is retried: ``INVALID_ARGUMENT`` (wrong flow, a batch over the
  peer's ``max_batch``, a request over its message size limit),
  ``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``FAILED_PRECONDITION``,
  ``DEADLINE_EXCEEDED`` and any other code fail at once, because another try
  would fail the same way or might write twice without the caller knowing.
- Every call together, retries and pauses included, ends within
  ``deadline_s``; each RPC gets what is left of it as its gRPC deadline.

Back-off: pauses start at ``initial_backoff_s`` and double up to
``max_backoff_s``, each drawn between half and all of the current value (so
that clients refused together do not come back together); a batch that
succeeds resets it. With several addresses, ``UNAVAILABLE`` moves to the next
address at once, and pauses only once every address failed in a row.

>>> from twinflow.cluster.grpc_server import AdminServicer, IngestServicer, create_server
>>> written = []
>>> def uplink(bodies, deadline_s):
...     written.extend(bodies)
...     return [f"1700000000000-{len(written) - len(bodies) + i}" for i in range(len(bodies))]
>>> server, port = create_server("127.0.0.1:0", ingest=IngestServicer("orders", uplink),
...     admin=AdminServicer(status=lambda: {"flow": "orders", "peer_id": "a", "role": "master"},
...                         handover=lambda timeout_s: {"ok": True, "new_master": "b"}))
>>> with Client(f"127.0.0.1:{port}", "orders") as client:
...     client.publish([{"id": "o1", "type": "order"}, b'{"id": "p1", "type": "payment"}'], batch_size=1)
...     client.status()["role"]
...     client.handover(timeout_s=2.0)["new_master"]
['1700000000000-0', '1700000000000-1']
'master'
'b'
>>> written[0]
b'{"id":"o1","type":"order"}'
>>> with Client(f"127.0.0.1:{port}", "payments") as client:
...     client.publish([b"{}"])
Traceback (most recent call last):
...
twinflow.client.PublishError: publish to flow 'payments' failed: INVALID_ARGUMENT: \
wrong flow 'payments': this peer serves 'orders' (0 written, 1 not confirmed)
>>> _ = server.stop(None).wait()
"""

from __future__ import annotations

import random
import threading
import time
from typing import Callable, Iterable, TypeVar

import grpc

from twinflow._escalation_client import Ack, EscalationClient
from twinflow._grpc_calls import (FAILURES, STATUS, _audit_action, _batches, _encode, _failures, _failures_request,
                                  _handover, _resume, _notices, _publish_once, _status, node_status, peer_status,
                                  publish, request_handover)
from twinflow.wire import twinflow_pb2 as pb
from twinflow.grpc_security import NO_SECURITY, GrpcSecurity
from twinflow.runtime.waiting import Backoff

__all__ = [
    "Ack",
    "Client",
    "EscalationClient",
    "PublishError",
    "node_status",
    "peer_status",
    "publish",
    "request_handover",
]

T = TypeVar("T")

DEFAULT_BATCH_SIZE = 1000
# A peer refuses a request over 64 MiB (grpc_server.DEFAULT_MAX_MESSAGE_BYTES); batches are cut
# well below that so that a batch of large bodies is split, not refused.
DEFAULT_MAX_BATCH_BYTES = 16 << 20

CHANNEL_OPTIONS = [
    # gRPC's default reconnect back-off starts at 1 s and grows to 120 s, during which calls on
    # the channel fail at once; a peer that restarts must be reachable again within the
    # client's own retries, which do the backing off.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

# The gRPC library's refusal of a request over the peer's size limit is RESOURCE_EXHAUSTED
# too, but a retry of the same request can never succeed.
_TOO_LARGE = "larger than max"


class PublishError(grpc.RpcError):
    """:meth:`Client.publish` gave up; nothing after ``positions`` is known to be written.

    Like the ``grpc.RpcError`` it stands for, ``code()`` and ``details()``
    give the status of the last attempt, also when the overall deadline ended
    the retries (``DEADLINE_EXCEEDED`` when it passed before a batch's first
    attempt, or an RPC ran out of time). ``positions`` are the uplink
    positions of the bodies written, a prefix of what was given, in order;
    ``unconfirmed`` bodies follow them, of which some may have been written
    when the code was ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED`` (see the module
    doc). ``attempts`` counts the Publish calls made for the batch that failed.
    """

    def __init__(self, flow: str, code: grpc.StatusCode, details: str, positions: list[str],
                 unconfirmed: int, attempts: int, address: str):
        self._code, self._details = code, details
        self.flow, self.positions, self.unconfirmed = flow, positions, unconfirmed
        self.attempts, self.address = attempts, address
        super().__init__(f"publish to flow {flow!r} failed: {code.name}: {details} "
                         f"({len(positions)} written, {unconfirmed} not confirmed)")

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Client:
    """Publishes to one flow and asks its peers for status and handover; keeps its channels open.

    ``address`` is one peer's gRPC address ("host:port") or a list of them;
    publishes start at the first and move on when a peer is unavailable (see
    the module doc for retries). ``security`` gives TLS and the tokens (the
    ``ingest`` scope for :meth:`publish` and :meth:`notices`; ``admin`` for
    :meth:`handover`, :meth:`resume`, :meth:`resubmit` and :meth:`discard`;
    for :meth:`status`, :meth:`failures` and :meth:`failure`, which only read,
    ``read`` when it holds a read token, else ``admin``). ``sleep``, ``monotonic`` and ``jitter`` (a number in
    [0, 1)) are the clock and randomness of the retries, for tests.

    Use it as a context manager, or call :meth:`close`: channels (and their
    connections) are opened on first use and kept for the next calls. A
    client may be shared between threads.
    """

    def __init__(
        self,
        address: str | list[str],
        flow: str,
        security: GrpcSecurity = NO_SECURITY,
        *,
        retry_unavailable: bool = True,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        channel_options: list[tuple[str, object]] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ):
        self.addresses = [address] if isinstance(address, str) else list(address)
        if not self.addresses:
            raise ValueError("a client needs at least one peer address")
        if initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("back-off needs 0 < initial_backoff_s <= max_backoff_s")
        self.flow, self.security = flow, security
        self.retry_unavailable = retry_unavailable
        self.backoff = Backoff(initial_backoff_s, max_backoff_s, jitter=jitter)  # the pauses between attempts
        self._options = CHANNEL_OPTIONS + list(channel_options or [])
        self._sleep, self._monotonic = sleep, monotonic
        self._lock = threading.Lock()
        self._channels: dict[tuple[str, str], grpc.Channel] = {}
        self._current = 0  # the address publishes go to first: the last one that answered
        self._closed = False

    # ---- publishing --------------------------------------------------------

    def publish(
        self,
        bodies: Iterable[bytes | dict],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        deadline_s: float = 10.0,
        publisher: str | None = None,
    ) -> list[str]:
        """Write ``bodies`` to the flow's uplink; return their uplink positions, in order.

        A dict is sent as its JSON text, bytes as they are. The bodies go in
        Publish calls of at most ``batch_size`` bodies and ``max_batch_bytes``
        bytes (a larger single body goes alone), one after another; a peer
        refuses a batch over its ``max_batch`` (10,000 by default). All of it,
        retries included, ends within ``deadline_s``. Raises
        :class:`PublishError` when it gives up (see the module doc).
        With ``publisher`` (1-128 letters, digits or ``_.:@/-``), the error
        notices of these messages name it, and :meth:`notices` reads them.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        encoded = [_encode(b, i) for i, b in enumerate(bodies)]
        end = self._monotonic() + deadline_s
        positions: list[str] = []
        for batch in _batches(encoded, batch_size, max_batch_bytes):
            positions.extend(self._publish_batch(batch, end, positions, len(encoded), publisher or ""))
        return positions

    def _publish_batch(self, batch: list[bytes], end: float, written: list[str], total: int,
                       publisher: str = "") -> list[str]:
        pauses = self.backoff.pauses()
        attempts = failed_in_row = 0
        code, details, address = grpc.StatusCode.OK, "", self.addresses[self._current]

        def give_up(code: grpc.StatusCode, details: str) -> PublishError:
            return PublishError(self.flow, code, details, list(written), total - len(written), attempts, address)

        while True:
            remaining = end - self._monotonic()
            if remaining <= 0:
                if not attempts:
                    raise give_up(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed before the batch was sent")
                raise give_up(code, f"{details} (gave up: the deadline passed, after {attempts} attempts)")
            current = self._current
            address = self.addresses[current]
            attempts += 1
            try:
                positions = _publish_once(self._channel(address, "ingest"), self.flow, batch, remaining, publisher)
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details() or ""
                if not self._retryable(code, details):
                    raise give_up(code, details) from None
                if code == grpc.StatusCode.UNAVAILABLE and len(self.addresses) > 1:
                    with self._lock:
                        if self._current == current:  # another thread may have moved on already
                            self._current = (current + 1) % len(self.addresses)
                    failed_in_row += 1
                    if failed_in_row % len(self.addresses):
                        continue  # another peer may be up: try it at once
                pause = next(pauses)
                if self._monotonic() + pause >= end:
                    raise give_up(code, f"{details} (gave up: the deadline would pass during the next "
                                        f"back-off, after {attempts} attempts)") from None
                self._sleep(pause)
                continue
            if len(positions) != len(batch):
                # A peer always answers one position per body; anything else is not twinflow's Ingest.
                raise give_up(grpc.StatusCode.INTERNAL,
                              f"{address} answered {len(positions)} positions for {len(batch)} bodies")
            return positions

    def _retryable(self, code: grpc.StatusCode, details: str) -> bool:
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return _TOO_LARGE not in details
        return code == grpc.StatusCode.UNAVAILABLE and self.retry_unavailable

    # ---- admin -------------------------------------------------------------

    def status(self, address: str | None = None, timeout_s: float = 5.0) -> dict:
        """The NodeStatus of the peer at ``address`` as a dict with every field.

        Without ``address``: of the first of the client's peers that answers,
        starting with the one publishes go to (its ``peer_id`` and
        ``grpc_address`` say which). Raises ``grpc.RpcError`` (the last
        peer's) when none answers.
        """
        if address is not None:
            return _status(self._channel(address, self._reading(STATUS)), timeout_s)
        last: grpc.RpcError | None = None
        for a in self._in_order():
            try:
                return _status(self._channel(a, self._reading(STATUS)), timeout_s)
            except grpc.RpcError as exc:
                last = exc
        assert last is not None
        raise last

    def statuses(self, timeout_s: float = 5.0) -> dict[str, dict | grpc.RpcError]:
        """Every address's status dict, or the ``grpc.RpcError`` its peer answered with."""
        out: dict[str, dict | grpc.RpcError] = {}
        for a in self.addresses:
            try:
                out[a] = _status(self._channel(a, self._reading(STATUS)), timeout_s)
            except grpc.RpcError as exc:
                out[a] = exc
        return out

    def handover(self, timeout_s: float = 5.0, address: str | None = None) -> dict:
        """Ask the master to hand mastership over within ``timeout_s``; the HandoverReply as a dict.

        The peer asked is ``address``, else the only address, else the first
        address whose status says ``master``; when none does, the reply is
        ``ok: False`` with the reason, and no peer was asked. A peer that is
        not master answers ``ok: False`` itself. Raises ``grpc.RpcError``.
        """
        if address is None and len(self.addresses) == 1:
            address = self.addresses[0]
        if address is None:
            roles = {a: s for a, s in self.statuses(timeout_s=min(timeout_s, 5.0)).items() if isinstance(s, dict)}
            address = next((a for a, s in roles.items() if s.get("role") == "master"), None)
            if address is None:
                return {"ok": False, "new_master": "", "seconds": 0.0,
                        "reason": f"no master among {', '.join(self.addresses)}"}
        return _handover(self._channel(address, "admin"), timeout_s)

    def resume(self, by: str = "", *, timeout_s: float = 10.0, address: str | None = None) -> list[dict]:
        """Ask the flow's master to end its suspensions now (``twinflow resume``): the first peer
        that answers writes the request. One dict per suspension it ends (``flow``, ``node``, ``id``,
        ``reason``, ``since``, ``until``); empty when the flow is not suspended. The ``admin``
        scope; raises ``grpc.RpcError``."""
        return self._first(lambda a: _resume(self._channel(a, "admin"), by, timeout_s), address)

    # ---- notices and the audit of failed messages ----------------------------

    def notices(self, publisher: str, after: str | None = None, max_count: int = 100, *,
                timeout_s: float = 5.0, address: str | None = None) -> tuple[list[dict], str]:
        """The error notices of ``publisher``'s messages after the cursor ``after`` (None: from the
        oldest the flow keeps), at most ``max_count``, and the cursor to pass next time.

        Each notice is a dict: ``id`` (the message ID), ``node``, ``outlink``, ``reason``, ``at``
        (the flow's time), ``position``, ``publisher``, ``flow`` and its own ``cursor``. Keep the
        cursor (across reconnects and restarts of the client): a call after it returns what
        came since, none twice and none missed while the flow keeps them
        (``notices.max_entries``). Asks ``address``, else the first peer that answers (the
        ``ingest`` scope). Raises ``grpc.RpcError``.
        """
        def call(a: str):
            return _notices(self._channel(a, "ingest"), self.flow, publisher, after or "", max_count, timeout_s)

        return self._first(call, address)

    def failures(self, *, node: str | None = None, reason: str | None = None, since: float | None = None,
                 until: float | None = None, status: str = "FAILED", limit: int = 100, after: str | None = None,
                 timeout_s: float = 10.0, address: str | None = None) -> list[dict]:
        """The flow's audit entries the filters take, oldest first (docs/operations/failures.md):
        ``node`` exactly, ``reason`` a part of it, ``since``/``until`` epoch seconds, ``status``
        FAILED, RESUBMITTED, DISCARDED or ANY. Each a dict with ``audit_id``, ``status``, the
        message (``message``, ``message_id``), ``node``, ``outlink``, ``reason``, ``at``,
        ``mark`` and ``outcome``. The ``read`` scope, else ``admin``; raises ``grpc.RpcError``."""
        request = _failures_request(self.flow, node, reason, since, until, status, limit, after)
        return self._first(lambda a: _failures(self._channel(a, self._reading(FAILURES)), request, timeout_s),
                           address)

    def failure(self, audit_id: str, *, timeout_s: float = 10.0, address: str | None = None) -> dict:
        """One audit entry, with its mark and the outcome of its resubmit; ``grpc.RpcError``
        ``NOT_FOUND`` when the flow has none of that ID."""
        request = _failures_request(self.flow, audit_id=audit_id)
        return self._first(lambda a: _failures(self._channel(a, self._reading(FAILURES)), request, timeout_s),
                           address)[0]

    def resubmit(self, audit_ids: Iterable[str] = (), *, all_matching: bool = False, by: str = "",
                 timeout_s: float = 60.0, address: str | None = None, **filters) -> list[dict]:
        """Resubmit audit entries: ``audit_ids``, or with ``all_matching`` every FAILED entry the
        ``filters`` take (those of :meth:`failures`). Each runs exactly once more, from the node
        it failed at. One dict per entry: ``ok``, and ``reason`` and ``refusal`` (``missing``,
        ``marked``, ``unusable``) when it was refused, which changed nothing; ``mark`` when done.
        ``by`` names the operator (default: the peer records this client's address)."""
        return self._audit_action(True, audit_ids, all_matching, by, timeout_s, address, filters)

    def discard(self, audit_ids: Iterable[str] = (), *, all_matching: bool = False, by: str = "",
                timeout_s: float = 60.0, address: str | None = None, **filters) -> list[dict]:
        """Mark audit entries DISCARDED (nothing runs again); as :meth:`resubmit`."""
        return self._audit_action(False, audit_ids, all_matching, by, timeout_s, address, filters)

    def _audit_action(self, resubmit: bool, audit_ids: Iterable[str], all_matching: bool, by: str,
                      timeout_s: float, address: str | None, filters: dict) -> list[dict]:
        request = pb.AuditActionRequest(flow=self.flow, audit_ids=list(audit_ids), all_matching=all_matching,
                                        filter=_failures_request(self.flow, **filters), by=by)
        return self._first(lambda a: _audit_action(self._channel(a, "admin"), request, resubmit, timeout_s),
                           address)

    def _first(self, call: Callable[[str], T], address: str | None) -> T:
        """``call(address)``; without one, the first of the client's peers that answers
        (``UNAVAILABLE`` moves on to the next; any other error is raised at once)."""
        if address is not None:
            return call(address)
        last: grpc.RpcError | None = None
        for a in self._in_order():
            try:
                return call(a)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                last = exc
        assert last is not None
        raise last

    # ---- channels ----------------------------------------------------------

    def _in_order(self) -> list[str]:
        n = self._current
        return self.addresses[n:] + self.addresses[:n]

    def _reading(self, method: str) -> str:
        """The scope a call of ``method``, which only reads, goes with: read when this client holds a
        read token (the least that suffices), else admin."""
        return self.security.scope_to_send(method)

    def _channel(self, address: str, scope: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise ValueError("the client is closed")
            channel = self._channels.get((address, scope))
            if channel is None:
                channel = self._channels[(address, scope)] = self.security.channel(address, scope, self._options)
            return channel

    def close(self) -> None:
        """Close every channel; a call after this raises ``ValueError``."""
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
