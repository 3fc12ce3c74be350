"""Where a history node keeps its entries: the :class:`HistoryStore` contract and the store in one
process's memory (:class:`MemoryHistoryStore`), which the cluster also loads from and writes to
Redis as state entries (``runtime/nodes/base.py``).

Each identifier (trigger, uuid) has a "processing" and a "completed" entry that share one
timestamp. Under failure: nothing here touches a server. An entry that is not [trigger, uuid] ->
[time, processing, completed] raises ValueError: :meth:`~MemoryHistoryStore.load` then changes
nothing, :meth:`~MemoryHistoryStore.apply` keeps the entries before it in the same call.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from operator import itemgetter
from typing import NamedTuple, Protocol

from ..json_text import key_text, loads

PROCESSING, COMPLETED = "processing", "completed"
Key = tuple[str, str]  # (trigger, uuid)


class Entry(NamedTuple):
    """What the history holds for one identifier: both entries share ``time``."""

    time: float
    processing: bool
    completed: bool


# Entry(...) runs a Python-level __new__; building from a tuple halves the cost.
_entry = partial(tuple.__new__, Entry)
_NOTHING = (0.0, False, False)


class HistoryStore(Protocol):
    """Where the history lives; the node needs only these three calls.

    ``put(key, status, time)`` adds the ``status`` ("processing" or
    "completed") entry of ``key`` at ``time``. Both entries of a key share
    one time: an entry at the time the key already has joins the other, an
    entry at another time (the message run again) replaces both.
    ``clear_expired(cutoff)`` removes every key whose time is at or before
    ``cutoff`` (both entries together), without scanning the keys it keeps,
    and returns how many it removed. The node never trusts a store to be
    prompt: it treats an entry at or before the cutoff as absent.
    """

    def get(self, key: Key) -> Entry | None: ...

    def put(self, key: Key, status: str, time: float) -> None: ...

    def clear_expired(self, cutoff: float) -> int: ...


class MemoryHistoryStore:
    """A :class:`HistoryStore` in one process's memory.

    Expiry walks a queue of (time, key) in the order entries were recorded
    and stops at the first one it keeps, so it costs O(1) per entry ever
    recorded. Times that go backwards delay the release of memory (an entry
    waits behind a later one), never a verdict.

    >>> store = MemoryHistoryStore()
    >>> store.put(("t", "u1"), PROCESSING, 5.0)
    >>> store.put(("t", "u1"), COMPLETED, 5.0)
    >>> store.get(("t", "u1"))
    Entry(time=5.0, processing=True, completed=True)
    >>> store.clear_expired(5.0), len(store)
    (1, 0)
    """

    def __init__(self) -> None:
        # Plain (time, processing, completed) tuples, not Entry: Python's collector stops
        # tracking a plain tuple of numbers at its first pass and never a NamedTuple's, so
        # with Entry objects every full collection walked the whole retention (measured:
        # 20% of a master's step time under a burst of 50,000, docs/performance.md).
        self._entries: dict[Key, tuple[float, bool, bool]] = {}
        self._changed: set[Key] = set()  # keys put or cleared since changed()
        # A key run again at a new time leaves a stale item behind; it is
        # skipped when it reaches the front, which keeps put() O(1).
        self._order: deque[tuple[float, Key]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Entry | None:
        raw = self._entries.get(key)
        return None if raw is None else _entry(raw)

    def put(self, key: Key, status: str, time: float) -> None:
        self._changed.add(key)
        old = self._entries.get(key)
        if old is None or old[0] != time:
            old = _NOTHING
            self._order.append((time, key))
        if status == PROCESSING:
            self._entries[key] = (time, True, old[2])
        elif status == COMPLETED:
            self._entries[key] = (time, old[1], True)
        else:
            raise ValueError(f"status must be {PROCESSING!r} or {COMPLETED!r} (got {status!r})")

    def clear_expired(self, cutoff: float) -> int:
        order, entries = self._order, self._entries
        removed = 0
        while order and order[0][0] <= cutoff:
            time, key = order.popleft()
            entry = entries.get(key)
            if entry is not None and entry[0] == time:
                del entries[key]
                self._changed.add(key)
                removed += 1
        return removed

    def oldest(self) -> float | None:
        """The time of the oldest entry, or None when there is none."""
        order, entries = self._order, self._entries
        while order:
            time, key = order[0]
            entry = entries.get(key)
            if entry is not None and entry[0] == time:
                return time
            order.popleft()  # a stale item: the key was run again later, or cleared
        return None

    def changed(self) -> dict[str, list | None]:
        """The entries put or cleared since the last call, as state entries (see base)."""
        changed, self._changed = self._changed, set()
        entries = self._entries
        return {key_text(key): list(entries[key]) if key in entries else None for key in changed}

    def apply(self, changes) -> None:
        """One step's changes as :meth:`changed` gave them (key text -> entry, None: cleared),
        applied as that step made them; nothing is recorded as changed here."""
        entries, order = self._entries, self._order
        for text, value in changes.items():
            key = tuple(loads(text))
            if value is None:
                entries.pop(key, None)  # its item in the order is skipped when it reaches the front
                continue
            if len(key) != 2 or len(value) != 3:
                raise ValueError("a history state entry is not [trigger, uuid] -> [time, processing, completed]")
            entry = tuple(value)
            old = entries.get(key)
            if old is None or old[0] != entry[0]:
                order.append((entry[0], key))
            entries[key] = entry

    def load(self, entries) -> None:
        # A new master loads every identifier of the retention before it delivers anything
        # (bench/state_load.py): map/zip/sort in C, no Python-level step per entry.
        keys = list(map(tuple, map(loads, entries)))
        values = list(map(tuple, entries.values()))
        if any(len(key) != 2 for key in keys) or any(len(value) != 3 for value in values):
            raise ValueError("a history state entry is not [trigger, uuid] -> [time, processing, completed]")
        self._entries.update(zip(keys, values))
        self._order.extend(sorted(zip(map(itemgetter(0), values), keys), key=itemgetter(0)))
