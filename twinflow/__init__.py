"""twinflow: active-active message flows on Spark Structured Streaming.

Importing the package turns gRPC's fork handlers off (unless ``GRPC_ENABLE_FORK_SUPPORT`` is
already set): with them on, grpcio 1.8x restarts its poller thread in every forked child, and a
child that closes its descriptors before ``exec`` (``subprocess`` with ``preexec_fn``, which is how
PySpark starts its JVM) can die before it runs anything: measured 4-17 failed starts in 300-500 on
this machine with a gRPC server and channel open, 0 in 1,000 with the handlers off. A node has
both gRPC and a JVM to start, so without this a node failed to start now and then with "Java
gateway process exited". twinflow never uses gRPC in a forked child, so it loses nothing. It only
works when the package is imported before ``grpc``; every twinflow module is.
"""

import os as _os

_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.2.0"
