"""Where a master's batch spends its wall time, phase by phase: one JSON line per batch in the
file ``twinflow run --batch-log FILE`` names (``twinflow bench flow-vs-passthrough`` reads them
for its per-batch breakdown, p50 and p99 per phase).

A batch passes two threads, one after the other. On Spark's thread (the ``spark`` lane):

- ``spark``: Spark's own work since the previous batch was handed on (offsets, planning,
  the checkpoint's logs): the JVM, with nothing of twinflow's;
- ``read``: reading the batch's entries from Redis by the offsets Spark logged;
- ``wait_previous``: waiting for the batch before it to finish on the batch thread;
- ``handled``: recording ``handled_id`` before the batch may run ahead of Spark (with its
  ``WAIT`` for replicas when the flow asks for them).

On the batch thread (the ``batch`` lane):

- ``idle``: nothing to do, from the end of the batch before to the start of this one;
- ``decode``: entries into messages;
- ``state_load``: loading the flow's state from Redis (a new term's first batch, a dropped flow);
- ``graph``: the flow's nodes building each step;
- ``commit``: waiting for a step's COMMIT (with its ``WAIT`` for replicas when asked) that
  building the next one did not cover;
- ``escalation``: reading how far each worker read, and sending the claims over gRPC;
- ``other``: the rest (guessing what is processed, chunking, counting).

Each line also has ``began`` and ``at``, the wall times the batch reached ``on_batch`` and its line
was written (the batch thread done with it). Only a batch run as master is written: a worker's baked batch has none of these phases.
Timing costs a clock read per phase per step (1,000 messages), none per message; with no file
named, nothing is timed.

Under failure: a line that cannot be written (a full disk) is given up with a warning, once;
the batch goes on. A batch that fails writes no line.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger("twinflow.peer")

SPARK_PHASES = ("spark", "read", "wait_previous", "handled")
BATCH_PHASES = ("idle", "decode", "state_load", "graph", "commit", "escalation", "other")
PHASES = SPARK_PHASES + BATCH_PHASES


class BatchPhases:
    """One batch's phases, in seconds; filled by one thread at a time (Spark's, then the batch
    thread's), so it needs no lock."""

    __slots__ = ("seconds", "batch_id", "entries", "started", "began")

    def __init__(self, batch_id: int = -1):
        self.seconds: dict[str, float] = {}
        self.batch_id = batch_id
        self.entries = 0
        self.started = 0.0  # when the batch thread took it (perf_counter)
        self.began = 0.0    # when it reached on_batch (wall clock, for the line)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - began)

    def record(self, took_s: float) -> dict:
        """The line for this batch: each phase in ms, ``other`` what the batch lane's named
        phases leave of ``took_s`` (the batch thread's time on it)."""
        named = sum(self.seconds.get(p, 0.0) for p in BATCH_PHASES if p not in ("idle", "other"))
        self.seconds["other"] = max(0.0, took_s - named)
        return {"began": round(self.began, 3), "at": round(time.time(), 3), "batch": self.batch_id,
                "entries": self.entries,
                "took_ms": round(took_s * 1000, 3),
                **{p: round(self.seconds.get(p, 0.0) * 1000, 3) for p in PHASES}}


class _NoPhases(BatchPhases):
    """What a member with no batch log times: nothing."""

    __slots__ = ()

    def add(self, phase: str, seconds: float) -> None:
        pass

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        yield


NO_PHASES = _NoPhases()


class BatchLog:
    """The member's batch log: phases begun on Spark's thread, written once the batch thread is
    done with them (module doc)."""

    def __init__(self, path: str | None):
        self.path = path
        self._file = open(path, "a", buffering=1) if path else None  # a line each: readable as it runs
        self._lock = threading.Lock()
        self._spark_back = None  # when on_batch last returned to Spark (perf_counter)
        self._batch_done = None  # when the batch thread last finished a batch

    @property
    def on(self) -> bool:
        return self._file is not None

    def begin(self, batch_id: int, read_s: float) -> BatchPhases:
        """A batch reached ``on_batch`` on Spark's thread, read from Redis in ``read_s``."""
        if self._file is None:
            return NO_PHASES
        phases = BatchPhases(batch_id)
        phases.began = time.time()
        now = time.perf_counter()
        if self._spark_back is not None:
            phases.add("spark", max(0.0, now - self._spark_back - read_s))
        phases.add("read", read_s)
        return phases

    def handed_on(self) -> None:
        """``on_batch`` returns to Spark (Spark's thread)."""
        if self._file is not None:
            self._spark_back = time.perf_counter()

    def taken(self, phases: BatchPhases, entries: int) -> None:
        """The batch thread starts on the batch."""
        if phases is NO_PHASES:
            return
        now = time.perf_counter()
        phases.started, phases.entries = now, entries
        if self._batch_done is not None:
            phases.add("idle", max(0.0, now - self._batch_done))

    def done(self, phases: BatchPhases) -> None:
        """The batch thread is done with a batch it ran as master: write its line."""
        if phases is NO_PHASES or self._file is None:
            return
        now = time.perf_counter()
        self._batch_done = now
        line = json.dumps(phases.record(now - phases.started))
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(line + "\n")
            except OSError as exc:
                log.warning("the batch log %s cannot be written (%s); no more lines go to it", self.path, exc)
                self._file = None

    def skipped(self) -> None:
        """The batch thread is done with a batch it did not run as master (no line)."""
        if self._file is not None:
            self._batch_done = time.perf_counter()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_batch_log(path: str) -> list[dict]:
    """The lines of a batch log (a line cut short by a stop is left out)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        return []
    return out
