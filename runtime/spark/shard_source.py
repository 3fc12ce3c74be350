"""Several Redis Streams (a flow's uplink shards) as one Spark streaming source, one partition each.

    register_shard_source(spark)        # build_session() does this
    df = (spark.readStream.format("twinflow_redis_shards")
          .option("url", "redis://127.0.0.1:6379/0")
          .option("shards", json.dumps([{"stream": "tf:{f.s0}:uplink"}, {"stream": "tf:{f.s1}:uplink"}]))
          .load())                      # shard INT, position STRING, data BINARY, size LONG

Unlike ``source.py``'s reader, which reads on the driver, this one only
*plans* on the driver: ``latestOffset`` finds, per shard, the last entry the
next batch takes (one READ_BATCH call that withholds every body, so only IDs
and sizes travel), and each shard with new entries becomes one
``InputPartition`` that an executor reads (``read``), so the bodies go
straight from Redis to the executor that processes them. Rows carry their
shard; a partition holds one shard's entries in uplink order.

Options: ``url`` and ``shards`` (a JSON list with, per shard, ``stream`` and
optionally ``status_key``, ``start_id``, ``start_n``); ``batch_size`` is
ignored (a batch takes what is there); ``max_batch_size`` (entries per shard
per batch, default 20,000), ``batch_bytes`` (body bytes per shard per batch),
``max_body_bytes``, ``connect_deadline_s``, ``block_ms``, ``pause_file``,
``hold_file`` and ``warmup`` as in ``source.py``, except that the hold file
holds a JSON list of the shards held (``stream.hold_shards``): a held shard
plans nothing while the others go on, and ``<hold_file>.ack`` lists the
shards the planner holds from then on (``stream.shard_hold_state``).

Packed rows (option ``pack``, N > 0), as in ``source.py``: each row carries
up to N consecutive entries of its shard, ``position`` the last one's ID,
``size`` how many, ``data`` their ``(position, data, size)`` triples pickled;
``packed_rows.unpack_rows`` gives them back (the warm-up row stays as it is).
A sharded flow's tasks take a partition whole (``shard_task``), so Spark's
per-row work, paid twice on this path (the read's Python worker into the
JVM, the JVM into the task's ``mapInArrow`` worker), is paid per N entries.

Offsets: ``{"shards": [{"id", "n", "max_body"}, ...], "warm": <query runs>}``,
one entry per shard in the order of the ``shards`` option (``warm`` grows by
one at each query run's warm-up batch, whose one row has shard -1); Spark checkpoints
them, so a restarted query resumes each shard right after its last planned
batch, and a replayed batch re-reads the same entries (the same bounds and
the ``max_body`` it was planned with).

Under failure: as ``source.py``. Every Redis call waits and retries up to
``connect_deadline_s``; an executor's read retries the same way. Each
shard's read progress (``status_key``: ``read_n``, ``read_id``) is recorded
when the next batch is planned, which proves the batch before it was
processed. When no shard has anything new, planning waits in Redis (XREAD
BLOCK) on each unheld shard in turn for ``block_ms / shards``, so an idle
query does not spin and an entry on any shard wakes it within that slice.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterator, List, Optional, Tuple

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from twinflow.runtime.positions import WARMUP_POSITION
from twinflow.runtime.spark.packed_rows import pack_rows
from twinflow.runtime.spark.reader_gates import _Paused, write_atomically
from twinflow.runtime.spark.redis_wait import _wait_for_entry
from twinflow.runtime.spark.source import RedisStreamReader
from twinflow.runtime.spark.source_options import (
    DEFAULT_BATCH_BYTES, DEFAULT_BLOCK_MS, DEFAULT_MAX_BODY_BYTES, _int_option)

log = logging.getLogger(__name__)

SHARD_SOURCE_NAME = "twinflow_redis_shards"
SHARD_SCHEMA = StructType(
    [
        StructField("shard", IntegerType(), False),
        StructField("position", StringType(), False),
        StructField("data", BinaryType(), True),
        StructField("size", LongType(), True),
    ]
)
WARMUP_SHARD = -1  # the warm-up row's shard
DEFAULT_MAX_BATCH = 20_000


def register_shard_source(spark: Any) -> None:
    spark.dataSource.register(RedisShardsDataSource)


class RedisShardsDataSource(DataSource):
    """Registered as ``twinflow_redis_shards``."""

    @classmethod
    def name(cls) -> str:
        return SHARD_SOURCE_NAME

    def schema(self) -> StructType:
        return SHARD_SCHEMA

    def streamReader(self, schema: StructType) -> "RedisShardsReader":
        return RedisShardsReader(self.options)


class ShardRange(InputPartition):
    """Entries of shard ``shard`` after ``after`` up to ``upto``; ``shard`` -1: the warm-up row."""

    def __init__(self, shard: int, after: str, upto: str, count: int, max_body: int):
        self.shard, self.after, self.upto, self.count, self.max_body = shard, after, upto, count, max_body


class RedisShardsReader(DataSourceStreamReader):
    """Plans on the driver, reads on executors; one ``RedisStreamReader`` per shard does the Redis work."""

    def __init__(self, options: dict) -> None:
        shards = json.loads(options.get("shards") or "[]")
        if not options.get("url") or not shards:
            raise ValueError(f"{SHARD_SOURCE_NAME}: options 'url' and 'shards' are required")
        self.max_batch = _int_option(options, "max_batch_size", DEFAULT_MAX_BATCH, 1)
        self.batch_bytes = _int_option(options, "batch_bytes", DEFAULT_BATCH_BYTES, 1)
        self.max_body = _int_option(options, "max_body_bytes", DEFAULT_MAX_BODY_BYTES, 0)
        self.block_ms = int(options.get("block_ms") or DEFAULT_BLOCK_MS)
        self.hold_file = options.get("hold_file") or None
        self.pack = _int_option(options, "pack", 0, 0)
        self._warmup_due = options.get("warmup") == "1"
        self._acked: set[int] = set()
        self.readers = []
        for shard in shards:
            # Each shard's reader keeps its own client, on the node that owns its
            # slot on a Redis Cluster (each shard has its own hash tag).
            self.readers.append(RedisStreamReader({
                **{k: v for k, v in options.items() if k not in ("shards", "hold_file", "warmup", "pack")},
                "stream": shard["stream"], "status_key": shard.get("status_key") or "",
                "start_id": shard.get("start_id") or "0-0", "start_n": str(shard.get("start_n") or 0),
                "max_batch_size": str(self.max_batch), "batch_size": str(self.max_batch),
            }))

    def initialOffset(self) -> dict:
        return {"shards": [{"id": r.start_id, "n": r.start_n} for r in self.readers], "warm": 0}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        # Planning the next batch means every batch up to ``start`` was processed.
        first = self.readers[0]
        try:
            first._check_pause()
            for reader, done in zip(self.readers, start["shards"]):
                reader._record_progress(done, pausable=True)
            if self._warmup_due:
                # A new count each query run (a restart resumes from a checkpointed one).
                self._warmup_due = False
                return {**start, "warm": int(start.get("warm", 0)) + 1}
            held = self._held_now()
            end = self._plan(start, held)
            if end == start["shards"] and self._wait_for_any(start, held):
                held = self._held_now()  # the hold may have changed while waiting
                end = self._plan(start, held)
            self._ack_hold(held)
        except _Paused:
            return start
        return {**start, "shards": end}

    def _ack_hold(self, held: set[int]) -> None:
        """Say which shards the plans from now on hold (``stream.shard_hold_state``): a hold
        seen here holds every later plan, since plans run one at a time and each reads the file."""
        if not self.hold_file or held == self._acked:
            return
        write_atomically(self.hold_file + ".ack", json.dumps(sorted(held)))
        self._acked = held

    def _plan(self, start: dict, held: set[int]) -> list[dict]:
        """Each shard's end offset for the next batch (its start when held or nothing is new)."""
        out = []
        for k, (reader, at) in enumerate(zip(self.readers, start["shards"])):
            if k in held:
                out.append(at)
                continue
            # Bodies withheld (max_body -1): only IDs and sizes come back.
            rows = reader._read_rows("plan a batch", at["id"], "+", -1, count=self.max_batch)
            taken, size = 0, 0
            for _, _, n in rows:
                cost = n if n is not None and n <= self.max_body else 0
                if taken and size + cost > self.batch_bytes:
                    break
                taken, size = taken + 1, size + cost
            if not taken:
                out.append(at)
                continue
            out.append({"id": rows[taken - 1][0], "n": int(at["n"]) + taken, "max_body": self.max_body})
        return out

    def _wait_for_any(self, start: dict, held: set[int]) -> bool:
        """Wait in Redis, shard by shard, for a new entry; True when one came."""
        open_shards = [k for k in range(len(self.readers)) if k not in held]
        if not open_shards:
            # All held: wait out a slice of the hold (stream.hold_shards lifts it).
            until = time.monotonic() + (self.block_ms or DEFAULT_BLOCK_MS) / 1000
            while self._held_now() == held and time.monotonic() < until:
                self.readers[0]._check_pause()
                time.sleep(0.01)
            return False
        slice_ms = max(1, (self.block_ms or 0) // len(open_shards))
        for k in open_shards:
            reader, after = self.readers[k], start["shards"][k]["id"]
            if reader._redis("wait for new entries",
                             lambda r, s=reader.stream, a=after: _wait_for_entry(r, s, a, slice_ms),
                             pausable=True):
                return True
        return False

    def _held_now(self) -> set[int]:
        if not self.hold_file:
            return set()
        try:
            with open(self.hold_file) as hold:
                return set(json.loads(hold.read() or "[]"))
        except (FileNotFoundError, ValueError):
            return set()

    def partitions(self, start: dict, end: dict) -> List[InputPartition]:
        parts: List[InputPartition] = []
        if end.get("warm", 0) != start.get("warm", 0):
            parts.append(ShardRange(WARMUP_SHARD, "", "", 1, 0))
        for k, (a, b) in enumerate(zip(start["shards"], end["shards"])):
            if a["id"] != b["id"]:
                parts.append(ShardRange(k, a["id"], b["id"], int(b["n"]) - int(a["n"]),
                                        int(b.get("max_body", self.max_body))))
        return parts

    def read(self, partition: ShardRange) -> Iterator[Tuple[int, str, Optional[bytes], Optional[int]]]:
        # On an executor: the same bounds as planned, so a replay reads the same entries.
        k = partition.shard
        if k == WARMUP_SHARD:
            yield (WARMUP_SHARD, WARMUP_POSITION, None, None)
            return
        reader = self.readers[k]
        after, n = partition.after, 0
        while after != partition.upto:
            rows = reader._read_rows("read a planned batch", after, partition.upto, partition.max_body)
            if not rows:
                break
            for position, data, size in (pack_rows(rows, self.pack) if self.pack else rows):
                yield (k, position, data, size)
            n += len(rows)
            after = rows[-1][0]
        if n != partition.count:
            log.warning("%s: %s..%s held %d entries, the plan had %d (stream trimmed?)",
                        reader.stream, partition.after, partition.upto, n, partition.count)

    def commit(self, end: dict) -> None:
        for reader, done in zip(self.readers, end["shards"]):
            reader._record_progress(done)


__all__ = ["SHARD_SOURCE_NAME", "SHARD_SCHEMA", "WARMUP_SHARD", "register_shard_source"]
