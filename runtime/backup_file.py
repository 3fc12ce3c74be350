"""The file of ``twinflow backup``: a flow's keys as Redis ``DUMP`` payloads, with their TTLs, checksummed.

Layout: one header line, JSON (UTF-8, ending in ``\\n``), then one record per key, each
``>I`` key length, the key, ``>q`` the key's remaining time to live in milliseconds when it
was copied (-1: none), ``>Q`` payload length, the ``DUMP`` payload. The header says what the
file is (``format``, ``version``), the flow, its shards (for each: its name, its key count,
the Redis time of the copy and the flow's epoch, processed mark, state version and last
uplink entry at that time), the twinflow and Redis versions that wrote it, the key count,
the body's length and ``sha256``: the SHA-256 of the header without that field (JSON with
sorted keys and no spaces), a newline, and the body. Nothing here touches a server.

Under failure: the file is written to a temporary file beside ``path``, flushed to disk and
renamed over it, so a reader finds the old file or the new one whole, never half of one
(mode 0600: it holds every message of the flow). :func:`read_backup` raises
:class:`BackupDamaged` with the reason (not a backup, another format version, truncated,
a checksum that does not match, a record that runs past the end) before it returns
anything: a file is used whole or not at all.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "f.tfb")
>>> header = write_backup(path, {"flow": "orders", "shards": []}, [(b"tf:{orders}:epoch", -1, b"payload")])
>>> header["keys"], header["bytes"]
(1, 44)
>>> read_backup(path)[1]
[Record(key=b'tf:{orders}:epoch', pttl_ms=-1, payload=b'payload')]
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Iterable, NamedTuple

FORMAT = "twinflow-backup"
VERSION = 1

_KEY = struct.Struct(">I")
_TTL_AND_SIZE = struct.Struct(">qQ")


class BackupDamaged(ValueError):
    """The file is not a twinflow backup this code reads, or not whole; the message says which."""


class Record(NamedTuple):
    key: bytes
    pttl_ms: int     # the time to live left when it was copied; -1: none
    payload: bytes   # what Redis's DUMP gave


def _canonical(header: dict) -> bytes:
    return json.dumps({k: v for k, v in header.items() if k != "sha256"}, sort_keys=True,
                      separators=(",", ":")).encode()


def write_backup(path: str | os.PathLike, header: dict, records: Iterable[tuple[bytes, int, bytes]]) -> dict:
    """Write ``records`` under ``header`` (to which the format, counts and checksum are added)
    to ``path`` atomically; returns the header as written."""
    pieces = []
    count = 0
    for key, pttl, payload in records:
        pieces += [_KEY.pack(len(key)), key, _TTL_AND_SIZE.pack(pttl, len(payload)), payload]
        count += 1
    full = {**header, "format": FORMAT, "version": VERSION, "keys": count, "bytes": sum(map(len, pieces))}
    digest = hashlib.sha256(_canonical(full) + b"\n")
    for piece in pieces:
        digest.update(piece)
    full["sha256"] = digest.hexdigest()
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(json.dumps(full, sort_keys=True).encode() + b"\n")
            for piece in pieces:
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename itself is on disk only once the directory is.
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return full


def read_backup(path: str | os.PathLike) -> tuple[dict, list[Record]]:
    """The header and the records of the backup at ``path``; BackupDamaged when it is not whole."""
    data = Path(path).read_bytes()
    line, newline, body = data.partition(b"\n")
    try:
        header = json.loads(line) if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BackupDamaged(f"{path} is not a twinflow backup (its first line is not a {FORMAT} header)")
    if header.get("version") != VERSION:
        raise BackupDamaged(f"{path} is a {FORMAT} of version {header.get('version')!r}; this twinflow "
                            f"reads version {VERSION}")
    if len(body) != header.get("bytes"):
        raise BackupDamaged(f"{path} is truncated or has bytes added: {len(body)} bytes of records, its "
                            f"header says {header.get('bytes')}")
    digest = hashlib.sha256(_canonical(header) + b"\n" + body).hexdigest()
    if digest != header.get("sha256"):
        raise BackupDamaged(f"{path} is damaged: its checksum does not match (sha256 {digest}, its header "
                            f"says {header.get('sha256')})")
    records = _records(body, str(path))
    if len(records) != header.get("keys"):
        raise BackupDamaged(f"{path} holds {len(records)} keys, its header says {header.get('keys')}")
    return header, records


def _records(body: bytes, name: str) -> list[Record]:
    records, at = [], 0
    view = memoryview(body)
    try:
        while at < len(body):
            (n,) = _KEY.unpack_from(body, at)
            at += _KEY.size
            key = bytes(view[at:at + n])
            at += n
            pttl, size = _TTL_AND_SIZE.unpack_from(body, at)
            at += _TTL_AND_SIZE.size
            if at + size > len(body) or len(key) != n:
                raise struct.error("a record runs past the end")
            records.append(Record(key, pttl, bytes(view[at:at + size])))
            at += size
    except struct.error as exc:
        raise BackupDamaged(f"{name} is damaged: record {len(records) + 1} at byte {at}: {exc}") from None
    return records
