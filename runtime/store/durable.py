"""Durable writes: a write to a flow's Redis that returns only once replicas confirm it.

A Redis failover promotes a replica, and whatever the replica had not received is gone.
A write that the flow builds on (a master's step before it escalates, the fencing epoch
of a promotion, a handled position before a checkpoint moves, failure records before
the mark passes them, an ingested entry before the producer is told) must therefore be
on ``replicas`` replicas (``cluster.wait_replicas``) before the call returns.
:class:`DurableWrites` gives a :class:`~.flow_store.FlowStore` the one way to write so.

The policy, for every such write:

- **One round trip when all is well.** The write's commands, a marker key unique to the
  call and ``WAIT replicas wait_ms`` go in one pipeline. Writing the marker moves this
  connection's replication offset to the primary's, so the ``WAIT`` covers everything
  written so far by any connection, also when the write itself changed nothing (a step
  applied already, a handled position behind the one recorded).
- **One deadline.** The whole call, the write and every confirmation after it, ends at
  the caller's ``deadline_s`` (None: the store's ``call_deadline_s``), measured on the
  store's injected ``monotonic``. Each ``WAIT`` blocks at most ``wait_ms``
  (``cluster.replica_wait_ms``), cut to the time left (at least 1 ms: ``WAIT 0`` would
  block for ever), so that a master's write never outlives its write lease by more than
  a round trip.
- **A short count is retried, then raised.** ``WAIT`` answering fewer than ``replicas``
  raises :class:`ReplicasShort` (a ``NOREPLICAS`` reply, transient), which the store's
  retrying call (``redis_calls.py``) waits out with its back-off (0.05 s doubling to
  1 s), as it waits out a connection error or a read-only replica; past the deadline
  the caller gets :class:`~.store_errors.RedisUnavailable` naming the replicas. The
  write is then in the primary but maybe on no replica: the caller must not act on it
  (a master steps down, a producer may publish again).
- **What is sent again.** Once a primary took the write, a retry sends only a
  confirmation: the marker written again, only if it is still there (``SET ... XX``),
  and ``WAIT``. A marker that is gone means the primary answering now does not have the
  write (a failover took it with it), and the write is sent again at once, with a
  ``WAIT`` of its own; a write whose reply never came is sent again as well. Every
  durable write is safe to send twice: a step carries a token and is applied once,
  epochs and handled positions only move forward, failure records are keyed by
  position, and the ID cache skips a published entry's second copy.
- **A refused write is not waited for.** ``refused(replies)`` may raise on the write's
  replies (a fenced or wrongly guessed COMMIT): that error propagates at once, before any
  ``WAIT``, since nothing was written.

With ``replicas`` 0 the write is sent alone, retried the same way up to its deadline. A
write sent by itself (``alone``) takes a second round trip for its marker and ``WAIT``.
A marker expires :data:`MARKER_SLACK_MS` after the longest ``WAIT`` (a marker gone only
by expiry makes a slow retry send the write again, which is safe). Scripts go in the
pipeline by ``EVALSHA`` alone (redis-py would first ask ``SCRIPT EXISTS``, a round trip
more); a Redis that does not know a script (one just promoted, or restarted) answers
``NOSCRIPT``, the scripts are loaded and the pipeline is sent again.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import redis
from redis.exceptions import NoScriptError

WriteFn = Callable[[Any], None]
# How long a call's marker outlives the longest WAIT: more than the store's longest pause
# between retries (1 s) and a round trip, so that only a failover removes it in time.
MARKER_SLACK_MS = 10_000


class ReplicasShort(redis.ResponseError):
    """``WAIT`` confirmed fewer replicas than a durable write needs (retried until the deadline)."""

    def __init__(self, acked: int, replicas: int, wait_ms: int):
        super().__init__(f"NOREPLICAS {acked} of {replicas} replicas confirmed within {wait_ms} ms")
        self.acked, self.replicas = acked, replicas


class DurableWrites:
    """The durable write of a :class:`~.flow_store.FlowStore` (see the module doc); the store
    provides ``r``, ``keys``, ``peer_id``, ``call_deadline_s``, ``scripts``, ``_monotonic`` and
    ``call``; a script in ``write`` is queued with ``scripts.queue``."""

    def write_durably(self, what: str, write: WriteFn, deadline_s: float | None = None, *, replicas: int = 0,
                      wait_ms: int = 1000, refused: Callable[[list], None] | None = None, alone: bool = False) -> list:
        """Send ``write(pipe)`` (which queues its commands on a pipeline) so that it survives a
        Redis failover when ``replicas`` > 0; returns the replies of what it queued. With
        ``alone``, ``write`` gets the client instead and sends its one command itself, and the
        marker and ``WAIT`` follow in a round trip of their own.

        Raises what ``refused`` raises on those replies, RedisUnavailable past ``deadline_s``
        (a short replica count included), StoreClosed when the store closes meanwhile.
        """
        limit = self.call_deadline_s if deadline_s is None else deadline_s
        began = self._monotonic()
        marker = self.keys.sync(f"{self.peer_id}:{uuid.uuid4().hex}") if replicas else ""
        ttl_ms = wait_ms + MARKER_SLACK_MS
        sent: list | None = None  # the write's replies, once a primary took it

        def attempt() -> list:
            nonlocal sent
            # At most wait_ms, and no later than the deadline (at least 1 ms).
            wait = max(1, min(wait_ms, int((limit - (self._monotonic() - began)) * 1000)))
            confirm = (("SET", marker, 1, "PX", ttl_ms), ("WAIT", replicas, wait)) if replicas else ()
            if sent is not None:
                still, acked = self._send(None, ("SET", marker, 1, "PX", ttl_ms, "XX"), confirm[1])
                if still is None:
                    sent = None  # the primary answering now does not have the write
            if sent is None:
                if alone:
                    out = [write(self.r), *(self._send(None, *confirm) if confirm else ())]
                else:
                    out = self._send(write, *confirm)
                sent = out[:len(out) - len(confirm)]
                if refused is not None:
                    refused(sent)
                acked = out[-1] if replicas else 0
            if int(acked) < replicas:
                raise ReplicasShort(int(acked), replicas, wait)
            return sent

        return self.call(what, attempt, deadline_s)

    def _send(self, write: WriteFn | None, *commands: tuple) -> list:
        """One pipeline: what ``write`` queues (None: nothing), then ``commands``; returns its
        replies. When Redis answers NOSCRIPT the flow's scripts are loaded and the pipeline is
        sent once more."""
        try:
            return self._pipeline(write, commands)
        except NoScriptError:
            for script in self.scripts.values():
                self.r.script_load(script.script)
        return self._pipeline(write, commands)

    def _pipeline(self, write: WriteFn | None, commands: tuple[tuple, ...]) -> list:
        pipe = self.r.pipeline(transaction=False)
        if write is not None:
            write(pipe)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute()
