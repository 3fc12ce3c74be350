"""A small harness for the defect tests: node processes of one flow, a publisher, an election blocker.

Everything here is real: ``twinflow run`` processes, the session's
redis-server and ZooKeeper, and kazoo for the blocker. The blocker queues in
the flow's election like a node and holds the master role without doing
anything, so a test decides exactly when a node may be promoted.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

import redis
from kazoo.client import KazooClient

from tests.conftest import wait_until
from twinflow.testing.checker import check_sink, read_sink
from twinflow.testing.processes import NodeProcess

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


class Flow:
    """One flow's files, keys and node processes in ``workdir``."""

    def __init__(self, workdir: Path, name: str, services, *, batch_size: int = 2000, bake_time: float = 5.0,
                 max_pending: int = 1_000_000, max_bytes: int = 1 << 20, text: str | None = None):
        """The claim-pair flow with these settings, or the flow file ``text`` (its ``flow:`` is
        replaced by ``name``)."""
        self.workdir, self.name, self.services = workdir, name, services
        self.path = workdir / "flow.yaml"
        if text is not None:
            self.path.write_text(re.sub(r"(?m)^flow: .*$", f"flow: {name}", text, count=1))
        else:
            self.path.write_text(FLOW.format(name=name, batch_size=batch_size, bake_time=bake_time,
                                             max_pending=max_pending, max_bytes=max_bytes))
        self.r = redis.Redis.from_url(services.redis_url)
        self.nodes: dict[str, NodeProcess] = {}
        self.sent: list[str] = []
        self._seq = 0

    def key(self, suffix: str) -> str:
        return f"tf:{{{self.name}}}:{suffix}"

    # -- nodes --------------------------------------------------------------
    def node(self, node_id: str, *, redis_url: str | None = None, zk: str | None = None,
             extra: list[str] | None = None) -> NodeProcess:
        """Start ``twinflow run`` for ``node_id`` (its state dir survives restarts)."""
        p = NodeProcess(node_id, str(self.path), redis_url or self.services.redis_url,
                        zk or self.services.zk_hosts, str(self.workdir / "state"),
                        str(self.workdir / f"{node_id}.log"), extra_args=list(extra or []))
        self.nodes[node_id] = p.start()
        return p

    def status(self, node_id: str) -> dict:
        h = self.r.hgetall(self.key(f"node:{node_id}"))
        return {k.decode(): v.decode() for k, v in h.items()}

    def wait_status(self, node_id: str, timeout_s: float = 90, **want) -> dict:
        def ok():
            if not self.nodes[node_id].alive():
                raise AssertionError(f"{node_id} exited:\n{self.logs()}")
            st = self.status(node_id)
            return st if st and all(st.get(k) == str(v) for k, v in want.items()) else None
        try:
            return wait_until(ok, timeout_s, interval_s=0.1, what=f"{node_id} with {want}")
        except AssertionError:
            print(self.logs())
            raise

    def read_upto(self, node_id: str) -> str | None:
        """The last uplink position whose batch ``node_id`` processed and Spark committed."""
        raw = self.r.hget(self.key(f"read:{node_id}"), "read_id")
        return raw.decode() if raw else None

    def stop_all(self) -> None:
        for p in self.nodes.values():
            if p.proc is not None and p.alive():
                try:
                    os.killpg(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.terminate(deadline_s=15)

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{p.log_tail(60)}" for n, p in self.nodes.items())

    # -- messages -----------------------------------------------------------
    def publish(self, n: int, prefix: str = "m") -> list[str]:
        """XADD ``n`` good documents {id, seq}; returns their uplink positions."""
        pipe = self.r.pipeline(transaction=False)
        ids = []
        for _ in range(n):
            mid = f"{prefix}{self._seq:06d}"
            pipe.xadd(self.key("uplink"), {"data": json.dumps({"id": mid, "seq": self._seq})})
            ids.append(mid)
            self._seq += 1
        positions = [p.decode() for p in pipe.execute()]
        self.sent.extend(ids)
        return positions

    def publish_docs(self, docs: list[dict]) -> list[str]:
        """XADD these documents as they are; returns their uplink positions."""
        pipe = self.r.pipeline(transaction=False)
        for doc in docs:
            pipe.xadd(self.key("uplink"), {"data": json.dumps(doc)})
        return [p.decode() for p in pipe.execute()]

    def stream(self, suffix: str) -> list[tuple[float, dict]]:
        """A stream's entries as (Redis time in s, fields other than data)."""
        return [(int(eid.decode().split("-")[0]) / 1000,
                 {k.decode(): v.decode() for k, v in f.items() if k != b"data"})
                for eid, f in self.r.xrange(self.key(suffix))]

    def publish_raw(self, body: bytes) -> str:
        return self.r.xadd(self.key("uplink"), {"data": body}).decode()

    def sink_ids(self) -> list[str]:
        return [e.id for e in read_sink(self.r, self.key("sink"))]

    def wait_delivered(self, timeout_s: float = 90):
        """Until every sent ID is in the sink; returns the exactly-once report."""
        try:
            wait_until(lambda: set(self.sent) <= set(self.sink_ids()), timeout_s, interval_s=0.2,
                       what=f"all {len(self.sent)} sent messages in the sink")
        except AssertionError:
            missing = sorted(set(self.sent) - set(self.sink_ids()))
            print(f"missing {len(missing)}: {missing[:10]}\n{self.logs()}")
            raise
        return check_sink(read_sink(self.r, self.key("sink")), self.sent)

    def zk_epoch(self) -> int:
        zk = KazooClient(hosts=self.services.zk_hosts)
        zk.start(timeout=10)
        try:
            stat = zk.exists(f"/twinflow/{self.name}/epoch")
            return stat.version if stat else 0
        finally:
            zk.stop()
            zk.close()


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
