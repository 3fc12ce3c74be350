"""What stops the Redis Stream reader from planning a batch: the pause, the hold and the pace
files that ``stream.start_stream`` names and ``stream`` writes.

It holds :class:`ReaderGates`, the part of ``source.RedisStreamReader`` that reads those files
and writes their acknowledgements, and the ``_Paused`` and ``_Held`` signals ``read()`` catches.

Hold (backpressure): while ``hold_file`` exists, each read plans nothing: it
waits up to ``block_ms`` (100 ms if ``block_ms`` is 0), checking every 10 ms,
and returns the start offset; it writes ``<hold_file>.ack``, a JSON object
``{"hold": <the hold file's text>, "held_reads": <reads held under it>,
"offset": <the start offset>}``, so whoever holds can see the reader has
stopped planning. Removing the file lets the read in progress go on at once.
A pause (``pause_file``) is still seen within 10 ms while held.

Pace: ``pace_file`` (set by ``stream.start_stream``, written by
``stream.pace_stream``) holds a number of milliseconds, and optionally a
second one, the read-behind; when the first is above 0 the reader plans a
batch at most that often (a read within the interval waits up to 100 ms of
it, then plans nothing). A worker, whose batches only bake, reads so in
fewer, larger batches and leaves the cores to the master
(docs/operations/speed.md); a pause or hold is still seen within 10 ms. With
a read-behind above 0 the reader reads no entry newer than that many
milliseconds (the source's "Read behind"), and plans at most every 100 ms.

Under failure: an acknowledgement file is written whole or not at all (written aside, then
renamed), so a poller never reads half of one; a pause is seen within 10 ms while held or
paced; a missing hold or pace file, or a pace file that holds no number, counts as none.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Optional

from twinflow.runtime.spark.source_options import DEFAULT_BLOCK_MS

_HOLD_CHECK_S = 0.01


class ReaderGates:
    """The pause, hold and pace of a ``source.RedisStreamReader``, whose ``__init__`` sets the
    files and the state these use."""

    def _check_pause(self) -> None:
        """Raise _Paused (after acknowledging) once the pause file exists.

        Checked in read() only: a paused reader plans no more batches, and
        since read(start) means every batch up to ``start`` is committed, the
        acknowledgement tells stop_stream that stopping now cuts nothing short.
        """
        if not self.pause_file or not os.path.exists(self.pause_file):
            return
        if not self._pause_acked:
            with open(self.pause_file + ".ack", "w") as ack:
                ack.write(json.dumps(self._reading_from))
            self._pause_acked = True
        raise _Paused()

    def _wait_out_hold(self, start: dict) -> None:
        """Return at once when not held; else acknowledge, wait, and raise _Held.

        The wait (about block_ms) keeps a held query from spinning through
        Spark's 10 ms polling; it ends early when the hold is lifted (then the
        read goes on) or a pause is asked (_Paused).
        """
        token = self._hold_token_now()
        if token is None:
            self._hold_token = None
            return
        if token != self._hold_token:
            self._hold_token, self._held_reads = token, 0
        self._held_reads += 1
        ack = {"hold": token, "held_reads": self._held_reads, "offset": start}
        write_atomically(self.hold_file + ".ack", json.dumps(ack))
        until = time.monotonic() + (self.block_ms or DEFAULT_BLOCK_MS) / 1000
        while True:
            self._check_pause()
            if not os.path.exists(self.hold_file):
                self._hold_token = None
                return
            left = until - time.monotonic()
            if left <= 0:
                raise _Held()
            time.sleep(min(_HOLD_CHECK_S, left))

    def _wait_out_pace(self) -> None:
        """Return once a paced reader may plan (see "Pace"); raise _Held after waiting 100 ms."""
        waited_until = time.monotonic() + DEFAULT_BLOCK_MS / 1000
        while True:
            pace_ms, behind_ms = self._pace_now()
            if behind_ms:
                pace_ms = max(pace_ms, DEFAULT_BLOCK_MS)  # a read behind finds more only as time passes
            left = self._last_plan + pace_ms / 1000 - time.monotonic()
            if left <= 0:
                return
            if time.monotonic() >= waited_until:
                raise _Held()
            self._check_pause()
            if self._hold_token_now() is not None:
                raise _Held()
            time.sleep(min(_HOLD_CHECK_S, left))

    def _pace_now(self) -> tuple[int, int]:
        """The pace and the read-behind in the pace file, in ms (0, 0 without one)."""
        if not self.pace_file:
            return 0, 0
        try:
            with open(self.pace_file) as pace:
                numbers = [max(0, int(x)) for x in pace.read().split()]
        except (FileNotFoundError, ValueError):
            return 0, 0
        pace_ms, behind_ms = (numbers + [0, 0])[:2]
        return pace_ms, behind_ms

    def _hold_token_now(self) -> Optional[str]:
        if not self.hold_file:
            return None
        try:
            with open(self.hold_file) as hold:
                return hold.read()
        except FileNotFoundError:
            return None


class _Paused(Exception):
    """A pause was asked for: read() reports no new data from now on."""


class _Held(Exception):
    """A hold is in place: this read() plans no batch."""


def write_atomically(path: str, text: str) -> None:
    """Replace ``path``'s text: a reader polling it sees the old or the new text, never half.

    Writers in several threads or processes may race (a member's timer thread and its
    promotion both set the pace): each writes aside under a name of its own, so the last
    replace wins and none fails. With one shared aside name, one writer's replace took the
    other's file away and a promotion failed with ENOENT (host-crash drill, seed 6).
    """
    aside = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    with open(aside, "w") as out:
        out.write(text)
    os.replace(aside, path)
