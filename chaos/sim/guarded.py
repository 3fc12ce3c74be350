"""The simulator's guarded handler: the example flow whose handler a history with external
completion guards (``examples/cluster-guarded.yaml``, kind ``guarded``), driven as the others are,
plus what only it has.

- **Kills inside a handler.** Right after a master's "processing" entry
  reached Redis (the STARTED script), and before the handler books the
  order, the writer may be killed (``Dims.handler_kill``, at most
  ``MAX_HANDLER_KILLS`` a run, and only while the faults last): its successor
  finds the message In Doubt and the resolver decides. A kill after the
  handler booked and before the step's COMMIT is the schedule's "kill the
  writer" while a COMMIT is in flight.
- **A ledger that goes down** (a fault): every call fails with a transient
  error, the action retries and then suspends the flow; every peer stops
  reading; the ledger comes back when the fault heals.
- **An operator's resume** while the flow is suspended (``twinflow resume``'s
  request, written through the store).
- **Orders the ledger refuses** (a fault): a published message's handler call
  fails with a service error, it leaves by ``error`` and is audited FAILED;
  **an operator's resubmit** (``twinflow failures resubmit``, through the
  store) makes the ledger take those orders again and resubmits them, during
  faults or after them (``heal``: whatever is still FAILED). The checker
  lets a resubmitted message leave once more per resubmit
  (:meth:`GuardedLedger.resubmits_of`), never more.

At the end of a run the ledger must hold every order booked once, and no
handler call repeated except through an In Doubt message the resolver sent
to run again (``guarded_drills.ledger_verdict``). And no second copy of an
order may leave as a Duplicate the resolver never decided before a run of
that order ended (:meth:`GuardedLedger.undecided_duplicates`): a copy that
comes while the first run is still under way (its handler waiting for a
retry while the ledger is down, say) is In Doubt, and the resolver is asked.
Under failure: nothing here raises but :class:`~.world.Killed`, for the kill
it decides.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ...cluster.flow_failures import FlowFailures
from ...cluster.master_flow import outlink_streams
from ...cluster.on_cluster import flow_keys
from ...runtime.nodes.history import DUPLICATE, NEW
from ...runtime.store.audit import AuditFilter
from ...runtime.store.flow_store import FlowStore
from ...testing.checker import read_sink
from ..guarded_drills import booking_name, ledger_kept, ledger_verdict, resolved_ids

if TYPE_CHECKING:
    from .world import SimPeer, World


# Kills inside handler calls per run, on top of the schedule's faults (MAX_FAULTS): every
# promotion's catch-up runs handlers too, so unbounded kills could keep any master from finishing one.
MAX_HANDLER_KILLS = 8


class GuardedLedger:
    """One run's ledger folder, its faults and its final check."""

    def __init__(self, world: "World", ledger: Path, rng: random.Random):
        self.world, self.ledger, self.rng = world, ledger, rng
        self.keys = flow_keys(world.graph)
        self.handler_node = next(n for n, node in world.graph.nodes.items() if getattr(node, "handler", None))
        # An operator's own client, on the producer's link (it never fails).
        self.operator = FlowStore(world.redis, self.keys, "operator", sleep=world.wait, monotonic=world.clock.now)
        self.kills = 0
        self.resumes = 0
        self.downs = 0
        self.refusals = 0
        self.resubmitted = 0
        self.failures = FlowFailures(world.graph.name, [self.operator])

    # -- kills inside a handler -----------------------------------------------
    def after_started(self, sim: "SimPeer") -> None:
        """A "processing" entry of ``sim``'s reached Redis: maybe kill ``sim`` before its handler runs."""
        from .world import Killed

        if not self.world.faults_on or self.kills >= MAX_HANDLER_KILLS:
            return  # no fault once the faults have ended, or the run could never settle
        if self.rng.random() >= self.world.dims.handler_kill or not sim.alive or sim.peer_id in self.world.stopping:
            return  # a peer in a graceful stop exits by it: the stop is what a rolling restart tests
        self.kills += 1
        self.world.kill(sim)
        raise Killed(sim.peer_id, f"{sim.peer_id} killed inside a handler call (its processing entry in Redis)")

    # -- the ledger down, an operator's resume ----------------------------------
    @property
    def down(self) -> bool:
        return (self.ledger / "down").exists()

    def go_down(self, duration: float) -> str:
        (self.ledger / "down").touch()
        self.downs += 1
        self.world.add_fault("the ledger down", duration, self.come_back)
        return f"the ledger is down for {duration:.1f} s"

    def come_back(self) -> None:
        (self.ledger / "down").unlink(missing_ok=True)

    def suspended(self) -> bool:
        return bool(self.world.redis.hlen(self.keys.suspended))

    def resume(self) -> str:
        held = self.operator.request_resume("operator", now=self.world.clock.now())
        self.resumes += 1
        return f"resume requested for {', '.join(held) or 'nothing'}"

    # -- refused orders and resubmits ----------------------------------------------
    def refuse(self, mid: str) -> str:
        (self.ledger / "refuse" / mid).touch()
        self.refusals += 1
        return f"the ledger refuses {mid}"

    def failed(self) -> list[str]:
        """The audit IDs of the handler's failures still FAILED (bad input is never resubmitted:
        it would fail again)."""
        return self.failures.matching(AuditFilter(node=self.handler_node))

    def resubmit(self) -> str:
        """Take the refused orders again and resubmit every handler failure still FAILED."""
        for path in (self.ledger / "refuse").iterdir():
            path.unlink()
        results = self.failures.resubmit(self.failed(), "operator")
        done = sum(r.ok for r in results)
        self.resubmitted += done
        return f"{done} resubmitted" + (f", {len(results) - done} refused" if done < len(results) else "")

    def heal(self) -> str | None:
        """After the faults: the ledger takes every order, and what is still FAILED is resubmitted
        (what fails later, the schedule resubmits as it goes on)."""
        self.come_back()
        for path in (self.ledger / "refuse").iterdir():
            path.unlink()
        return self.resubmit() if self.failed() else None

    def settled(self) -> bool:
        """Nothing of the handler's still FAILED, and every resubmitted entry has its outcome."""
        if self.failed():
            return False
        r, keys = self.world.redis, self.keys
        marks = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.audit_marks).items()}
        resubmitted = {k for k, m in marks.items() if m.get("status") == "RESUBMITTED"}
        return resubmitted <= {k.decode() for k in r.hkeys(keys.audit_outcomes)}

    def resubmits_of(self) -> Counter:
        """Message ID -> how many of its audit entries were resubmitted (each may leave once more)."""
        r, keys = self.world.redis, self.keys
        marks = {k.decode(): json.loads(v) for k, v in r.hgetall(keys.audit_marks).items()}
        return Counter(f[b"id"].decode() for i, f in r.xrange(keys.audit)
                       if marks.get(i.decode(), {}).get("status") == "RESUBMITTED")

    # -- the check --------------------------------------------------------------
    def problems(self, docs: dict[str, dict]) -> list[str]:
        """What the ledger shows against the documents the producer published (``docs``: message
        ID -> document)."""
        verdict = ledger_verdict(self.ledger)
        out = []
        if not ledger_kept(verdict):
            out.append(f"the ledger: {verdict['double_booked']} orders booked twice, {verdict['unbooked']} called "
                       f"and never booked, {verdict['repeated_calls']} calls repeated outside In Doubt ({verdict})")
        never = sorted({d["uuid"] for d in docs.values() if isinstance(d.get("uuid"), str) and d["uuid"]
                        and not (self.ledger / "booked" / booking_name(d["uuid"])).exists()})
        if never:
            out.append(f"the ledger: {len(never)} orders published and never booked: {', '.join(never[:10])}")
        undecided = self.undecided_duplicates(docs)
        if undecided:
            out.append(f"{len(undecided)} second copies left as a Duplicate while a run of their order was "
                       f"under way, and the resolver was never asked: {', '.join(undecided[:10])}")
        return out

    def undecided_duplicates(self, docs: dict[str, dict]) -> list[str]:
        """The message IDs that left through the history's ``duplicate`` undecided by the resolver
        (no line of theirs in ``resolved.jsonl``) at a flow time before any run of their order
        ended (left the flow downstream of ``new``) or the resolver decided a copy of it Duplicate.

        The history holds "completed" only from one of those two, written in the step that made
        it, so a Duplicate without the resolver comes at that time or later; one before it was a
        run still in progress, which is In Doubt."""
        graph, redis = self.world.graph, self.world.redis
        guard = graph.input
        streams = outlink_streams(graph, self.keys)
        downstream, todo = set(), [graph.links.get(guard, {}).get(NEW)]
        while todo:
            name = todo.pop()
            if name is not None and name not in downstream:
                downstream.add(name)
                todo.extend(graph.links.get(name, {}).values())
        decided = resolved_ids(self.ledger)
        order = lambda mid: docs.get(mid, {}).get("uuid")  # noqa: E731
        ended: dict[object, float] = {}  # order -> the earliest flow time it was known to be done
        duplicates = read_sink(redis, streams[(guard, DUPLICATE)])
        for (node, _), stream in streams.items():
            if node in downstream:
                for e in read_sink(redis, stream):
                    for mid in e.id.split("+"):
                        ended[order(mid)] = min(ended.get(order(mid), math.inf), e.at)
        for e in duplicates:
            if e.id in decided:
                ended[order(e.id)] = min(ended.get(order(e.id), math.inf), e.at)
        return [e.id for e in duplicates if e.id not in decided and order(e.id) is not None
                and e.at < ended.get(order(e.id), math.inf)]

    def counts(self) -> dict[str, int]:
        verdict = ledger_verdict(self.ledger)
        return {"handler_kills": self.kills, "ledger_downs": self.downs, "resumes_requested": self.resumes,
                "ledger_refusals": self.refusals, "resubmitted": self.resubmitted,
                "in_doubt_run_again": verdict["in_doubt_run_again"],
                "in_doubt_duplicate": verdict["in_doubt_duplicate"],
                "in_doubt_in_progress": verdict["in_doubt_in_progress"]}
