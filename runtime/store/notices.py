"""Error notices for publishers, read back from Redis in order with a cursor.

The master's COMMIT writes a notice to ``tf:{F}:notices`` for each message that leaves the
flow by an action's unlinked ``error`` outlink or an outlink the flow file's
``notices.outlinks`` names (``cluster/flow_audit.py``), with the publisher that gave the
message over gRPC (``tf:{F}:pub:<ID>``, written by the Ingest with the uplink entry). The
stream is capped at ``notices.max_entries``; what the cap removes is counted in
``tf:{F}:notices:removed``.

A reader asks for the notices after a cursor (a stream entry ID; None: from the oldest kept)
and gets them in order with the cursor to continue from, which moves past every entry
looked at, also the ones of other publishers; so a reader that keeps its cursor across
reconnects misses none and sees none twice, as long as it reads before the cap removes them.

Under failure: a read is one retrying call with a deadline (``redis_calls.py``); it changes
nothing in Redis, so a read that failed is simply asked again with the same cursor.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .flow_store import FlowStore

CURSOR = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
SCAN_LIMIT = 10_000   # entries one read looks at most (a rare publisher among many: the cursor moves on)
_PAGE = 500


def read_notices(store: "FlowStore", publisher: str | None, after: str | None = None, max_count: int = 100,
                 deadline_s: float | None = None, scan_limit: int = SCAN_LIMIT) -> tuple[list[dict], str | None]:
    """The notices of ``publisher`` (None: every publisher's) after the cursor ``after``, at most
    ``max_count``, and the cursor to continue from (``after`` again when there is nothing newer).
    ValueError for a cursor that is not a stream entry ID."""
    if after is not None and not CURSOR.fullmatch(after):
        raise ValueError(f"cursor {after!r} is not a notice cursor such as 1700000000000-0")
    if max_count < 1:
        raise ValueError(f"max_count must be at least 1, got {max_count}")
    key = store.keys.notices

    def read() -> tuple[list[dict], str | None]:
        found: list[dict] = []
        cursor, looked = after, 0
        while looked < scan_limit:
            low = "-" if cursor is None else "(" + cursor
            page = store.r.xrange(key, low, "+", count=min(_PAGE, scan_limit - looked))
            for raw_id, fields in page:
                cursor = _text(raw_id)
                looked += 1
                notice = {_text(k): _text(v) for k, v in fields.items()}
                if publisher is None or notice.get("publisher") == publisher:
                    found.append({"cursor": cursor, **notice})
                    if len(found) >= max_count:
                        return found, cursor
            if len(page) < _PAGE:
                break
        return found, cursor

    return store.call("read notices", read, deadline_s)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
