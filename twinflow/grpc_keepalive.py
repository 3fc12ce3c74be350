"""gRPC keepalive settings shared by the escalation stream, the client and the server.

A dead or frozen peer is noticed in 1-2 s on either side; the server lets
clients ping that often without striking them for it.
"""

CHANNEL_OPTIONS = [
    # Ping every 1 s and give up 1 s after an unanswered ping: a dead peer is
    # noticed in 1-2 s. The server side allows this (SERVER_OPTIONS below).
    # With grpcio 1.85 keepalive_timeout_ms alone did not end the stream of a
    # SIGSTOPped peer (the ping timer stayed at its 60 s default);
    # http2.ping_timeout_ms does, and also bounds a connect to a frozen peer.
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.ping_timeout_ms", 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A fresh connection per attempt: a shared subchannel could still be in
    # gRPC's own reconnect back-off from the previous attempt.
    ("grpc.use_local_subchannel_pool", 1),
]

SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    # Let clients ping often (escalation keepalive is 1 s) and never strike them for it.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]
