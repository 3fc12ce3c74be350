"""Escalation links for the simulator: the master's claims in flight to each worker, where the
simulator may drop, duplicate, delay or reorder them.

:class:`SimSender` has the interface of
:class:`twinflow.cluster.escalation.EscalationSender` that FlowMember uses
(``send``, ``stop``): it puts each batch, with the sender's epoch at the
time, on the link to every current member but itself. The real sender
resends unacknowledged batches on a new stream (so a batch may arrive
twice) and drops a batch the target refuses; :class:`EscalationNet` delivers
when the simulator says so, to the target's ``on_claims``, and a refused
batch (``StaleEpoch``) is dropped. Claims are a fast path only (the ID
cache and the processed mark are the record), so any of these faults may
cost latency but must never cost a message or feed one twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TYPE_CHECKING

from ...cluster.escalation import read_by

if TYPE_CHECKING:
    from ...cluster.escalation_servicer import Claim


@dataclass
class InFlight:
    source: str
    target: str
    epoch: int
    claims: list[Claim]


class EscalationNet:
    def __init__(self) -> None:
        self.in_flight: list[InFlight] = []
        self.cut: set[str] = set()  # peers whose escalation links are cut (nothing arrives)
        self.unread = 0  # claims left out: their target had not read the message (escalation.read_by)

    def put(self, batch: InFlight) -> None:
        self.in_flight.append(batch)

    def deliverable(self, ready: Callable[[str], bool]) -> list[int]:
        """Indexes of the batches whose target can take one now."""
        return [i for i, b in enumerate(self.in_flight)
                if ready(b.target) and b.source not in self.cut and b.target not in self.cut]

    def take(self, index: int) -> InFlight:
        return self.in_flight.pop(index)

    def drop_to(self, target: str) -> int:
        """A target process died: what was in flight to it is gone with its connection."""
        before = len(self.in_flight)
        self.in_flight = [b for b in self.in_flight if b.target != target]
        return before - len(self.in_flight)


class SimSender:
    def __init__(self, net: EscalationNet, peer_id: str, epoch: Callable[[], int],
                 targets: Callable[[], dict[str, str]]):
        self.net, self.peer_id, self.epoch, self.targets = net, peer_id, epoch, targets
        self.stopped = False
        self._last: dict[str, str] = {}  # the targets as last read

    def target_ids(self) -> list[str]:
        return sorted(self._last)

    def send(self, claims: list[Claim], read_upto: dict[str, str | None] | None = None) -> None:
        if self.stopped or not claims:
            return
        epoch = self.epoch()
        try:
            self._last = self.targets()
        except Exception:  # ZooKeeper cannot say who the members are: the real sender keeps its targets
            pass
        for target in self.target_ids():
            mine = claims if read_upto is None else read_by(claims, read_upto.get(target))
            self.net.unread += len(claims) - len(mine)
            if mine:  # as the real sender: only the claims of messages the target has read
                self.net.put(InFlight(self.peer_id, target, epoch, list(mine)))

    def flush(self, timeout_s: float) -> bool:
        return True

    def stop(self) -> None:
        self.stopped = True
