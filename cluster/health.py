"""The standard gRPC health service of a peer: what a load balancer or ``grpc_health_probe`` asks.

Each of the peer's services has its own status, and the empty name (the
server as a whole) follows Ingest:

- ``Admin`` is SERVING from the moment the server listens until it stops:
  status and handover answer while the peer warms up or Redis is down;
- ``Ingest`` and ``Escalation`` (and "") are SERVING only while the peer
  streams (its warm-up batch ran and it has not stopped), so a balancer
  sends publishes only to peers that are running the flow;
- at stop every service turns NOT_SERVING before the server goes away.

>>> h = PeerHealth()
>>> h.status("twinflow.wire.Ingest"), h.status("twinflow.wire.Admin")
('NOT_SERVING', 'SERVING')
>>> h.streaming(True); h.status("")
'SERVING'
"""

from __future__ import annotations

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import HealthServicer

ADMIN = "twinflow.wire.Admin"
STREAMING_SERVICES = ("", "twinflow.wire.Ingest", "twinflow.wire.Escalation")


class PeerHealth:
    def __init__(self) -> None:
        self.servicer = HealthServicer()
        self._statuses: dict[str, int] = {}
        self._set(ADMIN, True)
        self.streaming(False)

    def streaming(self, on: bool) -> None:
        for name in STREAMING_SERVICES:
            self._set(name, on)

    def stopping(self) -> None:
        """Every service NOT_SERVING (the peer is going away); later changes are ignored."""
        self.servicer.enter_graceful_shutdown()
        self._statuses = dict.fromkeys(self._statuses, health_pb2.HealthCheckResponse.NOT_SERVING)

    def status(self, service: str) -> str:
        """The status a Check of ``service`` answers now, by name."""
        return health_pb2.HealthCheckResponse.ServingStatus.Name(self._statuses[service])

    def _set(self, service: str, on: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if on else health_pb2.HealthCheckResponse.NOT_SERVING
        if self.servicer._gracefully_shutting_down:  # noqa: SLF001  (set() ignores it then too)
            return
        self._statuses[service] = status
        self.servicer.set(service, status)
