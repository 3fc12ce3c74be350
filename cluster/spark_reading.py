"""A peer's reading of one flow's uplink: one Spark query whose batches go to its one member.

Under failure: a batch whose ``on_batch`` raises is not committed and is
read again on restart; a stopped or failed query shows as ``isActive``
False, and the peer then exits with code 1 (``Peer.run_forever``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .member import FlowMember
    from .peer import Peer


class SparkReading:
    """The Spark query that reads ``member``'s uplink and calls its ``on_batch``."""

    def __init__(self, spark: Any, peer: "Peer", member: "FlowMember", start: dict):
        from ..runtime.spark.stream import start_stream

        checkpoint = member.checkpoint_dir()
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        cfg = peer.cfg
        self.query = start_stream(
            spark,
            redis_url=cfg.redis_url,
            stream=member.keys.uplink,
            checkpoint_dir=str(checkpoint),
            on_batch=member.on_batch,
            batch_size=member.read_size,
            max_batch_size=member.max_read_size,
            batch_bytes=member.spec.batch_bytes,
            max_body_bytes=member.spec.message.max_bytes,
            status_key=member.keys.read(cfg.peer_id),
            skip_key=member.keys.processed,  # no role needs what the masters processed
            query_name=f"{member.name}_{cfg.peer_id}".replace("-", "_"),
            source_options={"warmup": "1", "start_id": start["id"], "start_n": str(start["n"])},
        )

    @property
    def isActive(self) -> bool:  # noqa: N802  (Spark's name)
        return self.query.isActive

    def exception(self) -> Any:
        return self.query.exception()

    def hold(self, member: "FlowMember", held: bool) -> None:
        from ..runtime.spark.stream import hold_stream

        hold_stream(self.query, held)

    def pace(self, member: "FlowMember", interval_ms: int, behind_ms: int = 0) -> None:
        from ..runtime.spark.stream import pace_stream

        pace_stream(self.query, interval_ms, behind_ms)

    def stop(self) -> None:
        from ..runtime.spark.stream import stop_stream

        stop_stream(self.query, 10.0)
