"""The change log's entries as a reader sees them (the stream ``tf:{F}:changes``).

Every COMMIT of a flow whose nodes log their state changes (``Node.logs_state_changes``:
the history) appends one entry (``scripts.COMMIT``'s ``L`` operation): the version the
step made, the step's token (unique per step, so an entry a Redis failover lost and
another step wrote again at the same stream ID is told apart), and per logged node the
entries it changed as JSON (key -> value, null: gone). The log keeps about
``step.CHANGE_LOG_STEPS`` entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..json_text import loads

_VERSION, _TOKEN = b"v", b"t"


@dataclass(frozen=True)
class LogEntry:
    id: str                                  # the stream entry ID
    version: int                             # the state version its step made
    token: str                               # its step's token
    changes: dict[str, dict[str, Any]]       # node -> key -> value (None: gone)


def parse_entry(entry_id: bytes | str, fields: dict) -> LogEntry:
    """One stream entry (as redis-py returns it) as a :class:`LogEntry`."""
    changes = {}
    version = token = None
    for name, value in fields.items():
        if name == _VERSION:
            version = int(value)
        elif name == _TOKEN:
            token = value.decode()
        else:
            changes[name.decode()] = loads(value)
    if version is None or token is None:
        raise ValueError(f"change log entry {entry_id!r} has no version or no token")
    return LogEntry(entry_id.decode() if isinstance(entry_id, bytes) else entry_id, version, token, changes)


@dataclass
class ChangesRead:
    """What one read for a warm copy found, all of it at one moment (MULTI/EXEC)."""

    version: int                             # the state version in force
    mark: str | None                         # the processed mark
    anchor: LogEntry | None                  # the entry the reader applied last, if still in the log
    tail: list[LogEntry]                     # the entries after it (at most the count asked)
    entries: dict[str, dict[str, Any]]       # the state of the nodes asked for whole (node -> key -> value)
