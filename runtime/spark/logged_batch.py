"""A micro-batch's rows read by the driver from Redis, between the offsets Spark logged for it.

Spark writes a batch's end offset to the checkpoint's offset log
(``<checkpoint>/offsets/<batch id>``) before it runs the batch, and the
batch's entries are exactly what the source's ``readBetweenOffsets`` reads
between the previous batch's end offset and that one: what Spark itself
reads when it runs the batch again after a restart. So the driver can read
them from Redis itself, with the source's own code, instead of collecting
the batch's DataFrame: the collect is a Spark job, about 30 of the 65 ms a
micro-batch takes at 2,000 msg/s (docs/performance/throughput.md, "What earlier changes did to latency").

Under failure: :meth:`LoggedBatches.rows` answers None whenever it cannot
be sure it reads the logged batch (a checkpoint that is not a local
directory, an offset log in another format or with another source, an
earlier offset already purged); the caller then collects the DataFrame, as
before. Redis down: the read waits as the source's reads do (its connect
deadline), then raises, and the batch fails uncommitted.
"""

from __future__ import annotations

import json
import os
import threading
from typing import List, Optional

from twinflow.runtime.spark.packed_rows import Row

# How long the batch being handed to ``on_batch`` on this thread took to read (stream.py sets
# it on Spark's thread): a batch's first phase (cluster/batch_phases.py).
delivering = threading.local()


def delivered_read_s() -> float:
    """Seconds the batch ``on_batch`` is being called with on this thread took to read (0
    outside a delivery, or when nothing set it: the simulator, an executor)."""
    return getattr(delivering, "read_s", 0.0)


# The offset log's format version (Spark's OffsetSeqLog): line 1 "v1", line 2 the batch's
# metadata, then one line per source.
_LOG_VERSION = "v1"


def logged_offset(checkpoint_dir: str, batch_id: int) -> Optional[dict]:
    """The end offset Spark logged for ``batch_id`` of a query with one source, or None."""
    try:
        with open(os.path.join(checkpoint_dir, "offsets", str(batch_id))) as log:
            lines = log.read().split("\n")
    except OSError:
        return None
    lines = [line for line in lines if line]
    if len(lines) != 3 or lines[0] != _LOG_VERSION:
        return None
    try:
        offset = json.loads(lines[2])
    except ValueError:
        return None
    return offset if isinstance(offset, dict) and "id" in offset and "n" in offset else None


class LoggedBatches:
    """Reads each batch of one query by its logged offsets; ``reader`` is a
    ``RedisStreamReader`` with the query's source options (unpacked rows)."""

    def __init__(self, checkpoint_dir: str, reader) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.reader = reader
        self.counts = {"by_offsets": 0, "collected": 0}  # how each batch was read (stream.batch_reads)
        self._last: tuple[int, dict] | None = None  # the last batch read: (id, end offset)

    def rows(self, batch_id: int) -> Optional[List[Row]]:
        """The batch's rows as ``on_batch`` takes them, or None (see the module doc)."""
        end = logged_offset(self.checkpoint_dir, batch_id) if os.path.isdir(self.checkpoint_dir) else None
        start = self._start(batch_id)
        if end is None or start is None:
            self.counts["collected"] += 1
            return None
        rows = list(self.reader.readBetweenOffsets(start, end))
        self._last = (batch_id, end)
        self.counts["by_offsets"] += 1
        return rows

    def _start(self, batch_id: int) -> Optional[dict]:
        """Where ``batch_id`` begins: the end of the batch before (the one read last, without
        reading its log again, when it was), or the source's initial offset for the first."""
        if batch_id == 0:
            return self.reader.initialOffset()
        if self._last is not None and self._last[0] == batch_id - 1:
            return self._last[1]
        return logged_offset(self.checkpoint_dir, batch_id - 1)
