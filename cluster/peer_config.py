"""What one peer (one ``twinflow run`` process) is told at start: who it is, where the servers are.

Every field has the meaning of its ``twinflow run`` option (``twinflow run --help``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..grpc_security import NO_SECURITY, GrpcSecurity


@dataclass
class PeerConfig:
    peer_id: str
    redis_url: str
    zk_hosts: str
    listen: str = "127.0.0.1:0"
    advertise: str | None = None      # the address other peers dial; default: the bound one
    spark_master: str = "local[1]"
    spark_conf: dict | None = None    # further Spark settings (--spark-conf)
    state_dir: str = ".twinflow"
    connect_deadline_s: float = 60.0
    status_interval_s: float = 0.5
    sweep_interval_s: float = 1.0
    trim_interval_s: float = 10.0     # how often the master trims the uplink (uplink.retention)
    worker_pace_ms: int = 250         # a worker plans a batch at most this often (the master: at once)
    worker_read_behind_ms: int = 3000  # a worker reads no entry newer than this (the master: every one)
    start_from: str | None = None     # a new state dir on a processed flow: "processed" or "beginning"
    security: GrpcSecurity = NO_SECURITY  # gRPC TLS and tokens, served and used to escalate
    metrics_listen: str | None = None  # HOST:PORT of the peer's Prometheus metrics (HTTP), or none
    console_listen: str | None = None  # HOST:PORT of the peer's operator console (HTTPS with TLS), or none
    console_hosts: tuple[str, ...] = ()  # more names a console request's Host may give (host_check.py)
    batch_log: str | None = None       # a file for each master batch's phases, one JSON line each (batch_phases.py)
