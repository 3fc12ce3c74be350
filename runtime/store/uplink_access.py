"""A flow's uplink in Redis: publish, read a batch, count, trim, and how far behind a peer is.

It holds :class:`UplinkAccess`, the uplink part of ``FlowStore`` (``flow_store.py``); its
calls go through the store's retrying ``_call`` (``redis_calls.py``), ``publish`` through its
durable write (``durable.py``). Under failure: ``publish`` returns only once Redis has the
entries (with ``replicas``, once that many replicas have them), and a re-sent one may append
a body twice (the ID cache skips the second); a trim removes only entries no one needs
(``scripts.TRIM_UPLINK``); ``uplink_lag`` tries once and fails at once when Redis is down.
"""

from __future__ import annotations

from typing import Iterable

import redis

from . import scripts


class UplinkAccess:
    """The uplink methods of a :class:`~.flow_store.FlowStore`."""

    # -- uplink -----------------------------------------------------------
    def publish(self, bodies: Iterable[bytes], deadline_s: float | None = None, *, replicas: int = 0,
                replica_wait_ms: int = 1000, publisher: str = "", message_ids: Iterable[str] = ()) -> list[str]:
        """Append documents to the uplink; returns their entry IDs.

        RedisUnavailable once ``deadline_s`` passes without Redis answering. With
        ``replicas`` > 0 (``cluster.wait_replicas``, for the gRPC ingest) it returns only
        once that many replicas have the entries (``durable.py``), so that a Redis
        failover cannot erase an entry the producer was told is written. With
        ``publisher``, each of ``message_ids`` (the bodies' message IDs) is recorded as that
        publisher's for as long as the ID cache remembers an ID, in the same round trip:
        what the error notices of those messages name (``notices.py``).
        """
        bodies = list(bodies)
        owned = [self.keys.publisher(i) for i in message_ids] if publisher else []

        def write(pipe):
            for b in bodies:
                pipe.xadd(self.keys.uplink, {"data": b})
            for key in owned:
                pipe.set(key, publisher, ex=self.id_ttl)

        positions = self.write_durably("publish", write, deadline_s, replicas=replicas, wait_ms=replica_wait_ms)
        return [p.decode() if isinstance(p, bytes) else p for p in positions[:len(bodies)]]

    def read_uplink(self, after: str | None, upto: str, count: int, max_body: int, *,
                    max_bytes: int = 64 << 20, deadline_s: float | None = None
                    ) -> list[tuple[str, bytes | None, int | None]]:
        """Uplink entries after ``after`` (exclusive; None: from the start) up to ``upto``,
        as (position, data, size) rows bounded like a Spark batch: at most ``count``
        entries and ``max_bytes`` of bodies, a body over ``max_body`` withheld (data None)."""
        args = scripts.read_batch_args(after or "0-0", upto, count, max_bytes, max_body)
        reply = self.call("read uplink", lambda: self.scripts["read_batch"](keys=[self.keys.uplink], args=args),
                           deadline_s)
        return scripts.read_batch_rows(reply)

    def newest_position(self, deadline_s: float | None = None) -> str | None:
        """The position of the uplink's newest entry, or None when it has none."""
        entries = self.call("read uplink", lambda: self.r.xrevrange(self.keys.uplink, "+", "-", count=1), deadline_s)
        return entries[0][0].decode() if entries else None

    def read_uplink_after_processed(self, after: str | None, count: int, max_body: int, *,
                                    max_bytes: int = 64 << 20, deadline_s: float | None = None,
                                    skip_at_most: int | None = None, counted: tuple[str, int] | None = None
                                    ) -> tuple[list[tuple[str, bytes | None, int | None]], int, str | None]:
        """As :meth:`read_uplink` to the end, starting after the processed mark when it is
        further than ``after`` (as the Spark source with ``skip_key`` reads): (rows, entries
        skipped, the position they were skipped up to, or None). With ``skip_at_most``, a read
        that would skip more stops there, short of the mark, and returns no rows; ``counted``
        (to, how many) is what an earlier read from ``after`` skipped (READ_BATCH goes on from
        there while the mark has not gone back behind it)."""
        args = scripts.read_batch_args(after or "0-0", "+", count, max_bytes, max_body,
                                       skip_processed=skip_at_most or True, counted=counted)
        keys = [self.keys.uplink, self.keys.processed]
        reply = self.call("read uplink", lambda: self.scripts["read_batch"](keys=keys, args=args), deadline_s)
        return scripts.read_batch_result(reply)

    def entries_upto(self, position: str) -> int:
        """How many entries the uplink has had up to ``position``: all it was ever given
        minus those after it (counted by reading their IDs, so meant for a short tail)."""
        def count():
            try:
                added = int(self.r.xinfo_stream(self.keys.uplink).get("entries-added", 0))
            except redis.ResponseError:  # no stream yet
                return 0
            after, n = position, 0
            while True:
                page = self.r.xrange(self.keys.uplink, "(" + after, "+", count=10_000)
                n += len(page)
                if len(page) < 10_000:
                    return max(0, added - n)
                after = page[-1][0].decode()

        return self.call("count uplink entries", count)

    def trim_uplink(self, live_nodes: Iterable[str], retention_s: float, now_s: float,
                    deadline_s: float | None = 0) -> tuple[int, str | None]:
        """Trim the uplink entries that no one needs: before the processed mark, before the
        read position of every peer in ``live_nodes``, and older than ``retention_s`` at
        ``now_s`` (the margin kept for replay). Returns (entries trimmed, first entry kept)."""
        cutoff = f"{max(0, int((now_s - retention_s) * 1000))}-0"
        keys = [self.keys.uplink, self.keys.processed, self.keys.trimmed,
                *(self.keys.read(n) for n in sorted(live_nodes))]
        n, kept = self.call("trim uplink", lambda: self.scripts["trim_uplink"](keys=keys, args=[cutoff]),
                             deadline_s)
        return int(n), kept.decode() if isinstance(kept, bytes) else (kept or None)

    def trimmed_before(self) -> str | None:
        """The first uplink entry the last trim kept (entries before it are gone), or None."""
        raw = self.call("trim record", lambda: self.r.get(self.keys.trimmed))
        return raw.decode() if isinstance(raw, bytes) else raw

    def oldest_after(self, after: str | None) -> str | None:
        """The position of the first uplink entry after ``after`` (None: the first of all), or None."""
        low = "-" if after is None else "(" + after
        entries = self.call("read uplink", lambda: self.r.xrange(self.keys.uplink, low, "+", count=1))
        return entries[0][0].decode() if entries else None

    def uplink_lag(self, peer_id: str) -> int:
        """Uplink entries ``peer_id`` has not read yet (entries-added minus what it read).

        One attempt, no retry: status must answer (or fail) at once when Redis is down.
        """
        return self.uplink_behind(peer_id)[0]

    def uplink_behind(self, peer_id: str) -> tuple[int, float]:
        """How far ``peer_id`` is behind on the uplink: (entries it has not read yet, seconds).

        The seconds are the newest entry's time minus the time of the last entry the peer read
        (an entry ID is Redis's time in milliseconds; before the first read, the oldest entry's),
        0 when it has read every entry. The same two calls as the count alone: ``XINFO STREAM``
        and the peer's progress hash. One attempt, no retry, as :meth:`uplink_lag`.
        """
        try:
            info = self.r.xinfo_stream(self.keys.uplink)
        except redis.ResponseError:  # no stream yet
            info = {}
        read_n, read_id = self.r.hmget(self.keys.read(peer_id), ["read_n", "read_id"])
        behind = max(0, int(info.get("entries-added", 0)) - int(read_n or 0))
        if not behind:
            return 0, 0.0
        first = info.get("first-entry")
        since = entry_ms(read_id) if read_id else entry_ms(first[0]) if first else None
        newest = entry_ms(info.get("last-generated-id"))
        if since is None or newest is None:
            return behind, 0.0
        return behind, max(0, newest - since) / 1000.0


def entry_ms(entry_id: bytes | str | None) -> int | None:
    """The millisecond time of a stream entry ID, or None when ``entry_id`` is not one.

    >>> entry_ms(b"1764323400000-3"), entry_ms("12-0"), entry_ms("x"), entry_ms(None)
    (1764323400000, 12, None, None)
    """
    if isinstance(entry_id, bytes):
        entry_id = entry_id.decode()
    ms = (entry_id or "").partition("-")[0]
    return int(ms) if ms.isdigit() else None
