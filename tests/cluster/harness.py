"""What the cluster tests add to :class:`~twinflow.testing.local_cluster.LocalCluster`: the claim
pair with the settings a test picks, a cluster on given servers, an election blocker.

Everything here is real: ``twinflow run`` processes, the session's
redis-server and ZooKeeper, and kazoo for the blocker. The blocker queues in
the flow's election like a peer and holds the master role without doing
anything, so a test decides exactly when a peer may be promoted.
"""

from __future__ import annotations

import threading
from pathlib import Path

from kazoo.client import KazooClient

from tests.conftest import wait_until
from twinflow.testing.local_cluster import LocalCluster

FLOW = """\
flow: {name}
uplink: {{stream: uplink, batch_size: {batch_size}}}
message: {{id: id, id_ttl: 86400, max_bytes: {max_bytes}}}
input: deliver
nodes:
  deliver: {{type: action, sink: {{stream: sink}}}}
  sort: {{type: sort, pairs_with: deliver, key: seq, key_type: int, bake_time: {bake_time}, max_pending: {max_pending}}}
cluster: {{session_timeout: 2.0}}
"""


def claim_pair(batch_size: int = 2000, bake_time: float = 5.0, max_pending: int = 1_000_000,
               max_bytes: int = 1 << 20) -> str:
    """The claim pair's flow file with these settings."""
    return FLOW.format(name="claim-pair", batch_size=batch_size, bake_time=bake_time, max_pending=max_pending,
                       max_bytes=max_bytes)


def cluster_on(services, workdir: Path, flow: str, text: str | None = None, **settings) -> LocalCluster:
    """A started :class:`LocalCluster` of ``flow`` in ``workdir`` on ``services`` (the session's, or
    any object with ``redis_url`` and ``zk_hosts``), no peer running yet (``cluster.peer(id)``
    starts one); its flow file ``text`` or the claim pair with ``settings``."""
    return LocalCluster(str(workdir), flow=flow, text=text or claim_pair(**settings), peers=(),
                        services=services).start()


class ElectionBlocker:
    """Queues in the flow's election as "blocker" and, once it holds the lock, keeps it until released."""

    def __init__(self, zk_hosts: str, flow: str):
        self.zk = KazooClient(hosts=zk_hosts, timeout=2.0)
        self.zk.start(timeout=10)
        self.election = self.zk.Election(f"/twinflow/{flow}/election", "blocker")
        self.holding = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self.election.run, args=(self._hold,), daemon=True)
        self._thread.start()
        wait_until(lambda: "blocker" in self.election.contenders(), 10, what="the blocker to queue")

    def _hold(self) -> None:
        self.holding.set()
        self._release.wait()

    def release(self) -> None:
        """Give the role up (and leave the election); calling it again does nothing."""
        if self._release.is_set():
            return
        self._release.set()
        self.election.cancel()
        self._thread.join(timeout=10)
        self.zk.stop()
        self.zk.close()
