"""The deployment guide's machines as the guide lab makes them, and how long it waits on them:
the four hosts (``host-a`` to ``host-d``) with the address each takes on the lab's subnet and
the peer each runs, the peers of the guide's first day, the service user the guide adds, the
``PATH`` root's commands run with, and the deadlines of the lab's waits.

Every module of the guide lab (:mod:`.guide_lab` and the parts mixed into its ``GuideLab``)
reads these from here, so a host, a user or a deadline is named once.

Under failure: nothing here runs; the deadlines are what bound every wait of the guide lab
(a server's answer, a peer streaming, a Sentinel failover, a block's run), each of which
raises once its deadline passes.
"""

from __future__ import annotations

# Each host: the last octet of its address on the lab's subnet, and the peer it runs (None: none).
HOSTS = {"host-a": (11, "peer-a"), "host-b": (12, "peer-b"), "host-c": (13, None), "host-d": (14, "peer-c")}
PEER_HOSTS = {"peer-a": "host-a", "peer-b": "host-b", "peer-c": "host-d"}
FIRST_PEERS = ("peer-a", "peer-b")  # the guide's first day; its topology sections add and remove more
USER = "twinflow"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVER_DEADLINE_S = 90.0
PEER_DEADLINE_S = 180.0
REDIS_FAILOVER_S = 30.0  # the lab's reads wait this long for the Sentinels to name a new primary
BLOCK_TIMEOUT_S = {"install": 1200.0, "run": 600.0}
