"""Publishing to a local cluster's uplink: :class:`Producing`, the publishing half of
:class:`~twinflow.testing.local_cluster.LocalCluster` (through the producer's proxy when
proxied, following the primary on a Redis with replicas)."""

from __future__ import annotations

import json
import time

import redis


class Producing:
    """Mixed into :class:`~twinflow.testing.local_cluster.LocalCluster`: uses its ``producer``
    client, ``keys``, ``ha``, ``wait_replicas`` and ``_on_ha``."""

    def publish(self, docs: list[dict]) -> list[str]:
        """XADD through the producer's proxy, retrying while that link is down; returns positions.

        The pipeline is built again for each attempt: redis-py empties a pipeline when it
        executes, failed or not, so a retried one sent nothing and "published" every
        message of the batch (the redis-restart drill found it: 50 messages counted lost
        that were never sent). A retry after a lost reply may append a batch twice; the
        flow's ID cache takes each message once."""
        if self.ha is not None:
            return self._publish_ha(docs)
        deadline = time.monotonic() + 30
        while True:
            pipe = self.producer.pipeline(transaction=False)
            for doc in docs:
                pipe.xadd(self.keys.uplink, {"data": json.dumps(doc)})
            try:
                positions = [p.decode() for p in pipe.execute()]
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            if len(positions) != len(docs):
                raise RuntimeError(f"published {len(positions)} of {len(docs)} documents")
            return positions

    def _publish_ha(self, docs: list[dict]) -> list[str]:
        """XADD on the primary of the moment; with ``wait_replicas``, acknowledged only once WAIT
        says that many replicas have the batch (else the batch is sent again: the ID cache takes
        each message once)."""
        def send(r):
            pipe = r.pipeline(transaction=False)
            for doc in docs:
                pipe.xadd(self.keys.uplink, {"data": json.dumps(doc)})
            if self.wait_replicas:
                pipe.execute_command("WAIT", self.wait_replicas, 1000)
            out = pipe.execute()
            if self.wait_replicas and int(out.pop()) < self.wait_replicas:
                raise redis.ConnectionError(f"WAIT: fewer than {self.wait_replicas} replicas have the batch")
            return [p.decode() for p in out]

        positions = self._on_ha("producer", send)
        if len(positions) != len(docs):
            raise RuntimeError(f"published {len(positions)} of {len(docs)} documents")
        return positions
