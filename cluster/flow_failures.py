"""A flow's failed messages for its operators and its publishers, over every uplink shard: the
audit (list, show, resubmit, discard) and the error notices.

One implementation for both ways in: ``twinflow failures`` over Redis, and a peer's Admin and
Ingest services (``grpc_server.py``), which make the same store calls. A flow of one shard
names an audit entry by its audit ID (a stream entry ID, ``1700000000000-0``); a sharded
flow by the shard's flow name and the ID (``orders.s1/1700000000000-0``), as a sharded
publish names uplink positions. A notice cursor is likewise a stream entry ID, or for a
sharded flow the cursor of each shard (``orders.s0/1-0,orders.s1/5-0``).

Under failure: each call raises what the store raises (RedisUnavailable past its deadline);
a resubmit or discard of many goes on past an entry it refuses, and says per entry what it
did; a refused one changed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..runtime.positions import position_order
from ..runtime.store.audit import AuditEntry, AuditError, AuditFilter, AuditStore
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.notices import read_notices

MAX_LIST = 10_000      # entries one listing returns at most
MAX_NOTICES = 10_000   # notices one read returns at most


@dataclass
class ActionResult:
    """What a resubmit or discard did to one audit entry."""

    audit_id: str
    ok: bool
    reason: str = ""     # why it was refused
    refusal: str = ""    # AuditError.kind
    mark: dict | None = None

    def as_dict(self) -> dict:
        return {"audit_id": self.audit_id, "ok": self.ok, "reason": self.reason, "refusal": self.refusal,
                "mark": self.mark}


class FlowFailures:
    """The audit and notices of flow ``name``, whose shards' stores are ``stores`` (one: unsharded), in
    shard order; ``max_bytes`` bounds a resubmit's envelope (``message.max_bytes``),
    ``replicas`` and ``replica_wait_ms`` make a resubmit durable as a publish is; ``deadline_s``
    bounds each Redis call (None: the stores' own deadline)."""

    def __init__(self, name: str, stores: list[FlowStore], *, max_bytes: int = 1 << 20, replicas: int = 0,
                 replica_wait_ms: int = 1000, deadline_s: float | None = None):
        if not stores:
            raise ValueError("a flow has at least one store")
        self.name, self.stores = name, stores
        self.audits = [AuditStore(s) for s in stores]
        self.sharded = len(stores) > 1
        self.max_bytes, self.replicas, self.replica_wait_ms = max_bytes, replicas, replica_wait_ms
        self.deadline_s = deadline_s

    # -- audit IDs as the tools show them -----------------------------------
    def ref(self, k: int, audit_id: str) -> str:
        return f"{self.stores[k].keys.flow}/{audit_id}" if self.sharded else audit_id

    def _resolve(self, ref: str) -> tuple[int, str]:
        if not self.sharded:
            return 0, ref
        shard, slash, audit_id = ref.rpartition("/")
        for k, store in enumerate(self.stores):
            if slash and shard == store.keys.flow:
                return k, audit_id
        raise AuditError("missing", ref, f"{ref!r} names no shard of this flow: a sharded flow's audit IDs "
                                         f"are <shard flow>/<ID>, such as {self.stores[0].keys.flow}/1700000000000-0")

    def _row(self, k: int, entry: AuditEntry) -> dict:
        row = entry.as_dict()
        row["audit_id"] = self.ref(k, entry.id)
        return row

    # -- the audit --------------------------------------------------------
    def list(self, filt: AuditFilter = AuditFilter(), limit: int = 100, after: str | None = None) -> list[dict]:
        """Up to ``limit`` entries ``filt`` takes, oldest first (across shards), after ``after``."""
        limit = max(1, min(limit, MAX_LIST))
        after_id = self._resolve(after)[1] if after else None
        rows: list[tuple[tuple[int, int], dict]] = []
        for k, audit in enumerate(self.audits):
            for entry in audit.entries(filt, limit, after_id, deadline_s=self.deadline_s):
                rows.append((position_order(entry.id), self._row(k, entry)))
        rows.sort(key=lambda r: r[0])
        return [row for _, row in rows[:limit]]

    def show(self, ref: str) -> dict:
        """The entry ``ref`` with its mark and outcome; AuditError (missing) when there is none."""
        k, audit_id = self._resolve(ref)
        entry = self.audits[k].entry(audit_id, self.deadline_s)
        if entry is None:
            raise AuditError("missing", ref, self.audits[k].missing(audit_id))
        return self._row(k, entry)

    def resubmit(self, refs: Iterable[str], by: str) -> list[ActionResult]:
        """Resubmit each audit entry of ``refs`` (see ``AuditStore.resubmit``)."""
        return [self._act(ref, by, resubmit=True) for ref in refs]

    def discard(self, refs: Iterable[str], by: str) -> list[ActionResult]:
        """Mark each audit entry of ``refs`` DISCARDED."""
        return [self._act(ref, by, resubmit=False) for ref in refs]

    def matching(self, filt: AuditFilter) -> list[str]:
        """The audit IDs of every entry ``filt`` takes, oldest first in each shard."""
        return [self.ref(k, e.id) for k, audit in enumerate(self.audits)
                for e in audit.scan(filt, deadline_s=self.deadline_s)]

    def _act(self, ref: str, by: str, resubmit: bool) -> ActionResult:
        try:
            k, audit_id = self._resolve(ref)
            audit = self.audits[k]
            if resubmit:
                mark = audit.resubmit(audit_id, by, max_bytes=self.max_bytes, replicas=self.replicas,
                                      replica_wait_ms=self.replica_wait_ms, deadline_s=self.deadline_s)
            else:
                mark = audit.discard(audit_id, by, deadline_s=self.deadline_s)
        except AuditError as exc:
            return ActionResult(ref, False, exc.reason, exc.kind)
        return ActionResult(ref, True, mark=mark)

    def counts(self) -> dict[str, int]:
        """The audit's counts (``AuditStore.counts``), summed over the shards."""
        total: dict[str, int] = {}
        for audit in self.audits:
            for name, n in audit.counts(self.deadline_s).items():
                total[name] = total.get(name, 0) + n
        return total

    # -- notices ----------------------------------------------------------
    def notices(self, publisher: str | None, after: str | None = None, max_count: int = 100
                ) -> tuple[list[dict], str]:
        """The notices of ``publisher`` (None: all) after the cursor ``after``, at most ``max_count``
        (ValueError for a bad cursor), and the cursor to continue from."""
        max_count = max(1, min(max_count, MAX_NOTICES))
        if not self.sharded:
            found, cursor = read_notices(self.stores[0], publisher, after or None, max_count)
            return found, cursor or ""
        cursors = self._shard_cursors(after)
        found: list[dict] = []
        for k, store in enumerate(self.stores):
            if len(found) >= max_count:
                break
            page, cursors[k] = read_notices(store, publisher, cursors[k], max_count - len(found))
            for notice in page:
                notice["cursor"] = f"{store.keys.flow}/{notice['cursor']}"
            found += page
        return found, ",".join(f"{s.keys.flow}/{c}" for s, c in zip(self.stores, cursors) if c)

    def _shard_cursors(self, after: str | None) -> list[str | None]:
        cursors: list[str | None] = [None] * len(self.stores)
        names = {s.keys.flow: k for k, s in enumerate(self.stores)}
        for part in filter(None, (after or "").split(",")):
            shard, slash, cursor = part.rpartition("/")
            if not slash or shard not in names:
                raise ValueError(f"cursor part {part!r} names no shard of this flow (<shard flow>/<ID>)")
            cursors[names[shard]] = cursor
        return cursors
