"""Packed rows of the Redis Stream source: up to N consecutive entries in one Spark row, and back
(``source.py``, "Packed rows").

Pure functions, no I/O. Under failure they promise only that :func:`unpack_rows` gives back
exactly the entries :func:`pack_rows` packed, in order, bodies withheld as they were, and
passes a warm-up row as it is.
"""

from __future__ import annotations

import pickle
from typing import List, Optional, Tuple

from twinflow.runtime.positions import WARMUP_POSITION

PACK_BYTES = 4 * 1024 * 1024  # body bytes per packed row, about (a row holds at least one entry)
Row = Tuple[str, Optional[bytes], Optional[int]]
def pack_rows(rows: List[Row], per_row: int) -> List[Row]:
    """``rows`` packed ``per_row`` entries (and about PACK_BYTES) to a row; see "Packed rows"."""
    packed: List[Row] = []
    start, size = 0, 0
    for i, (_, data, _) in enumerate(rows):
        if i > start and (i - start >= per_row or size + len(data or b"") > PACK_BYTES):
            packed.append(_packed(rows[start:i]))
            start, size = i, 0
        size += len(data or b"")
    if start < len(rows):
        packed.append(_packed(rows[start:]))
    return packed


def _packed(chunk: List[Row]) -> Row:
    return chunk[-1][0], pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL), len(chunk)


def unpack_rows(positions: List[str], data: List[Optional[bytes]], sizes: List[Optional[int]]) -> List[Row]:
    """One ``(position, data, size)`` per entry from a batch's columns of packed rows (the
    warm-up row passes as it is).

    >>> rows = [("1-0", b"{}", 2), ("2-0", None, None), ("3-0", None, 9)]
    >>> packed = pack_rows(rows, 2)
    >>> [(p, n) for p, _, n in packed]
    [('2-0', 2), ('3-0', 1)]
    >>> unpack_rows(*map(list, zip(*packed))) == rows
    True
    """
    rows: List[Row] = []
    for position, blob, _ in zip(positions, data, sizes):
        if position == WARMUP_POSITION:
            rows.append((position, None, None))
        else:
            rows.extend(pickle.loads(blob))
    return rows
