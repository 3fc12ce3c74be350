"""What a drill keeps and what it is given while it runs: :class:`FaultRecord`, when each fault
began (and, for a fault that lasts, ended) and how far the producer got, kept alike by a drill
on a local cluster and a drill between lab hosts (``host_drills.HostDrill``); and
:class:`Drill`, what a local drill's function (:mod:`.drill_faults`) is given: the cluster,
the roles at the start, the seeded random source, the producer's gate.

The fault times are what the checker measures each recovery from, and the windows are what
the drill's timeline draws.

Under failure: a wait for the producer raises RuntimeError naming the count it did not reach
by its deadline; :meth:`Drill.kill` refuses, with the cluster's logs, when the peer it is to
kill is no longer master, so no drill reports on a fault it did not inject.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..runtime.waiting import wait_for
from ..testing.local_cluster import LocalCluster


class FaultRecord:
    """When each fault began and what it was, and how far the producer got: what a drill on a
    local cluster (:class:`Drill`) and a drill between lab hosts (``host_drills.HostDrill``)
    both keep. Needs ``sent``, ``total``, ``faults``, ``windows`` and ``say``."""

    sent: Callable[[], int]
    total: int
    faults: list[float]
    windows: list[list]
    say: Callable[[str], None]

    def wait_sent(self, share: float, timeout_s: float = 300) -> None:
        want = int(self.total * share)
        if not wait_for(lambda: self.sent() >= want, timeout_s, 0.05):
            raise RuntimeError(f"the producer did not reach {want} messages")

    def fault(self, what: str, lasts: bool = False) -> None:
        """A fault begins now (its recovery time counts); ``lasts``: until ``healed()``, else an instant."""
        now = time.time()
        self.faults.append(now)
        self.windows.append([now, None if lasts else now, what])
        self.say(f"  fault: {what} (after {self.sent()} messages)")

    def window(self, what: str) -> None:
        """A condition from now to the end of the drill (or ``healed()``) that is no fault of its own."""
        self.windows.append([time.time(), None, what])
        self.say(f"  {what}")

    def healed(self) -> None:
        """The last fault still on ends now."""
        for w in reversed(self.windows):
            if w[1] is None:
                w[1] = time.time()
                return


@dataclass
class Drill(FaultRecord):
    """What a drill function sees: the cluster, the roles at the start, the seeded random source."""

    cluster: LocalCluster
    master: str
    worker: str
    rng: random.Random
    sent: Callable[[], int]
    total: int
    faults: list[float] = field(default_factory=list)  # when each fault began (epoch s)
    windows: list[list] = field(default_factory=list)  # [start, end or None (still on), what], for the timeline
    say: Callable[[str], None] = lambda text: None
    producing: threading.Event = field(default_factory=threading.Event)  # cleared: the producer waits

    def __post_init__(self) -> None:
        self.producing.set()

    def resume(self, share: float = 0.1) -> None:
        """Let a held producer go on, and wait until ``share`` more of the messages went out, so
        the next fault finds the cluster under load again (the recovery time needs writes before it)."""
        want = self.sent() + int(self.total * share)
        self.producing.set()
        if not wait_for(lambda: self.sent() >= want, 300, 0.05):
            raise RuntimeError(f"the producer did not reach {want} messages")

    def kill(self, master: str, heir: str) -> None:
        """The fault most drills end with: SIGKILL ``master``; wait until ``heir`` is master.

        Refuses when ``master`` is no longer master: the drill would not test what it says
        (with the proxy's old latency, the redis-latency drill's master had lost its role)."""
        now = self.cluster.master()
        if now != master:
            raise RuntimeError(f"{master} is not master before the fault (master: {now}):\n{self.cluster.logs()}")
        self.fault(f"SIGKILL master {master}")
        self.cluster.peers[master].kill()
        self.cluster.wait_role(heir, "master")
