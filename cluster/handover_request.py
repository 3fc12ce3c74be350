"""Asking a flow's masters to hand their role over, as ``twinflow handover`` and the console do.

The masters are found in the peers' statuses in Redis (one per shard; a peer hands over
every shard it is master of), and each is asked over gRPC (``Admin/Handover``, the admin
token).

Under failure: a master that does not answer, or refuses the token, is reported with its
error and the others are still asked; Redis not answering raises (nothing was asked).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._grpc_calls import request_handover
from ..grpc_security import GrpcSecurity
from ..runtime.store.flow_store import FlowStore


@dataclass(frozen=True)
class HandoverAsked:
    """One master asked: its ``reply`` (ok, new_master, seconds, reason), or the ``error`` it failed with."""

    address: str
    reply: dict | None = None
    error: Exception | None = None

    def as_dict(self) -> dict:
        if self.reply is not None:
            return {"address": self.address, **self.reply}
        return {"address": self.address, "ok": False, "reason": f"did not answer: {self.error}"}


def masters(stores: list[FlowStore]) -> list[str]:
    """The gRPC address of every live master of the flow whose shards' stores are ``stores``."""
    return sorted({r["grpc_address"] for store in stores for r in store.read_statuses()
                   if r.get("role") == "master" and r.get("grpc_address")})


def ask_masters(stores: list[FlowStore], security: GrpcSecurity, timeout_s: float) -> list[HandoverAsked]:
    """Ask every master to hand over within ``timeout_s``; empty when there is no live master."""
    import grpc

    asked = []
    for address in masters(stores):
        try:
            asked.append(HandoverAsked(address, reply=request_handover(address, timeout_s=timeout_s,
                                                                       security=security)))
        except grpc.RpcError as exc:
            asked.append(HandoverAsked(address, error=exc))
    return asked
