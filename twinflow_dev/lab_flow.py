"""What a lab's flow shows, read from its Redis primary as ``twinflow status`` and the checker
read it: each peer's status (of every shard), who is master, what left the flow, the sink, the
uplink's entry times. Mixed into :class:`.lab.Lab`, which gives ``redis()`` (a client made in
the client host's namespace), ``plan``, ``state``, ``alive()`` and ``peer_of()``.

Under failure: a Redis that does not answer raises redis-py's error (each call is bounded by
the client's socket time-outs); nothing here retries.
"""

from __future__ import annotations

import json
from typing import Callable

from .lab_hosts import PEERS


class FlowReadings:
    """A lab's flow as Redis holds it (see module)."""

    _flow = None

    def peer_ids(self) -> tuple[str, ...]:
        """The peers of the lab's flow (a lab that adds or removes peers says which it runs)."""
        return PEERS

    def _keys(self):
        """The flow's graph and each shard's Redis keys (one for an unsharded flow), read once
        from the lab's flow file."""
        if self._flow is None:
            from twinflow.cluster.on_cluster import flow_keys
            from twinflow.runtime.flowgraph import load_graph
            from twinflow.runtime.shards import shard_graph

            graph = load_graph(self.plan.flow_path)
            shards = self.plan.shards
            self._flow = graph, [flow_keys(shard_graph(graph, k) if shards > 1 else graph) for k in range(shards)]
        return self._flow

    def _on_redis(self, read: Callable):
        client = self.redis()
        try:
            return read(client)
        finally:
            client.close()

    def shard_statuses(self) -> dict[str, list[dict]]:
        """Each peer's status hash in each shard ({} where it has none)."""
        _, shard_keys = self._keys()
        decode = lambda h: {k.decode(): v.decode() for k, v in h.items()}  # noqa: E731
        return self._on_redis(lambda r: {p: [decode(r.hgetall(keys.peer(p))) for keys in shard_keys] for p in self.peer_ids()})

    def peer_statuses(self) -> dict[str, dict]:
        """Each peer's status hash in Redis, as ``twinflow status`` reads it ({} for a peer without
        one). Of a sharded flow, shard 0's, with ``role`` the one it has in every shard ("mixed"
        when they differ) and ``streaming`` "1" only when it streams in every shard."""
        out = {}
        for p, rows in self.shard_statuses().items():
            row = dict(rows[0])
            if len(rows) > 1 and row:
                roles = {r.get("role") for r in rows}
                row["role"] = roles.pop() if len(roles) == 1 else "mixed"
                row["streaming"] = "1" if all(r.get("streaming") == "1" for r in rows) else "0"
            out[p] = row
        return out

    def master(self) -> str | None:
        """The peer whose status says master (of every shard) and whose process runs, or None."""
        rows = self.peer_statuses()
        for p in reversed(self.state.processes):
            peer = self.peer_of(p)
            if peer is not None and rows.get(peer, {}).get("role") == "master" and self.alive(p):
                return peer
        return None

    def shard_masters(self) -> list[str | None]:
        """Each shard's master (None where no peer's status says master)."""
        rows = self.shard_statuses()
        shards = len(self._keys()[1])
        return [next((p for p in self.peer_ids() if rows[p][k].get("role") == "master"), None) for k in range(shards)]

    def ready(self) -> bool:
        """Every peer streams (in every shard) and every shard has a master."""
        rows = self.peer_statuses()
        return all(rows.get(p, {}).get("streaming") == "1" for p in self.peer_ids()) and all(self.shard_masters())

    def shard_outputs(self) -> list[dict]:
        """What left each shard of the flow through each outlink so far ("node.outlink" ->
        SinkEntry list), one dict per shard."""
        from twinflow.cluster.master_flow import outlink_streams
        from twinflow.testing.checker import read_outputs

        graph, shard_keys = self._keys()
        return self._on_redis(lambda r: [read_outputs(r, outlink_streams(graph, keys)) for keys in shard_keys])

    def outputs(self) -> dict:
        """What left the flow (every shard) through each outlink so far ("node.outlink" -> SinkEntry list)."""
        from twinflow.testing.checker import merge_outputs

        return merge_outputs(self.shard_outputs())

    def sink_entries(self) -> list:
        """The flow's sink (the paired action's, every shard's) in write order, for
        :func:`~.checker.failover_seconds`."""
        from twinflow.testing.checker import read_sink

        _, shard_keys = self._keys()
        entries = self._on_redis(lambda r: [e for keys in shard_keys for e in read_sink(r, keys.sink)])
        return sorted(entries, key=lambda e: e.written_ms)

    def uplink_times(self) -> dict[str, int]:
        """Each uplink entry's message ID -> the entry's time (ms since the epoch, Redis's clock)."""
        _, shard_keys = self._keys()

        def read(client) -> dict[str, int]:
            out = {}
            for keys in shard_keys:
                start = "-"
                while True:
                    page = client.xrange(keys.uplink, min=start, max="+", count=10_000)
                    for eid, fields in page:
                        try:
                            out[str(json.loads(fields[b"data"])["id"])] = int(eid.split(b"-")[0])
                        except (ValueError, KeyError, TypeError):
                            pass  # an entry that is no message of ours
                    if len(page) < 10_000:
                        break
                    start = "(" + page[-1][0].decode()
            return out
        return self._on_redis(read)
