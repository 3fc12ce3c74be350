"""Seeded failover simulation: random schedules and faults over the real node code, with the
promises checked after every step (``twinflow simulate``).

One run (:func:`run_once`) builds a :class:`World` (two nodes, the chained
flow by default), then takes ``steps`` steps. Each step picks, with the
run's seeded random source, one thing that can happen now: the producer
publishes, a node reads a batch, runs its timers or notices what ZooKeeper
did, an escalation batch arrives (or is dropped, duplicated, reordered),
time passes, or a fault starts: a node killed (restarted later, with its
disk or without), paused past its session or not, cut from ZooKeeper, from
Redis (requests or replies lost) or from its escalation links. After every
step the checker reads what left the flow and asserts:

- nothing left twice (every message leaves the flow once, through one outlink);
- one writer per epoch (no two nodes wrote at the same epoch);
- no stale write (nothing written at an epoch older than one already written).

Then the faults end, dead nodes restart, and the run goes on until every
published message has left the flow, or ``settle_s`` virtual seconds pass:
whatever has not left by then is lost.

The same seed gives the same schedule, the same faults and the same trace
(run it with ``PYTHONHASHSEED=0``, which the CLI sets). A failing run
returns its trace: every step with its virtual time and what it did.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import shutil
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ...cluster.demo import order_or_payment
from ...cluster.master_flow import outlink_streams
from ...cluster.node import flow_keys
from ...runtime.flowgraph import parse_graph
from ..invariants import sink_entry
from .world import START_TIME, SimNode, SimulationStuck, World

CHAINED = Path(__file__).resolve().parent.parent.parent / "examples" / "cluster-chained.yaml"
MAX_FAULTS = 5


@dataclass
class RunResult:
    seed: int
    steps: int
    sent: int
    left: int                       # sent messages that left the flow
    lost: int
    duplicated: int
    problems: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    faults: int = 0
    promotions: int = 0
    killed_ahead: int = 0           # kills of a node whose batch ran ahead of its checkpoint, unfinished

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {"seed": self.seed, "steps": self.steps, "sent": self.sent, "left": self.left, "lost": self.lost,
                "duplicated": self.duplicated, "faults": self.faults, "promotions": self.promotions,
                "killed_ahead": self.killed_ahead, "passed": self.passed, "problems": self.problems[:5]}


class Checker:
    """Reads each output stream from where it left off and checks the step-wise promises."""

    def __init__(self, world: World):
        keys = flow_keys(world.graph)
        self.world = world
        self.streams = list(outlink_streams(world.graph, keys).values())
        self.after = {s: "0-0" for s in self.streams}
        self.left: Counter = Counter()
        self.writer: dict[int, str] = {}
        self.newest = 0
        self._commits_seen = -1

    def check(self) -> list[str]:
        problems = []
        if self.world.commits[0] == self._commits_seen:
            return problems  # no commit since the last check: no output can have been written
        self._commits_seen = self.world.commits[0]
        for stream in self.streams:
            for position, e in read_sink_after(self.world.redis, stream, self.after[stream]):
                self.after[stream] = position
                for member in e.id.split("+"):
                    self.left[member] += 1
                    if self.left[member] > 1:
                        problems.append(f"{member} left the flow {self.left[member]} times "
                                        f"(again via {stream}, node {e.node}, epoch {e.epoch})")
                first = self.writer.setdefault(e.epoch, e.node)
                if first != e.node:
                    problems.append(f"two writers at epoch {e.epoch}: {first} and {e.node}")
                if e.epoch < self.newest:
                    problems.append(f"stale write: {e.node} wrote {e.id} at epoch {e.epoch} after epoch "
                                    f"{self.newest} had written")
                self.newest = max(self.newest, e.epoch)
        return problems


def read_sink_after(client, stream: str, after: str):
    """(position, SinkEntry) for each entry of ``stream`` after ``after``."""
    return [(eid.decode(), sink_entry(eid, fields)) for eid, fields in client.xrange(stream, min="(" + after)]


class Schedule:
    """The seeded choices of one run."""

    def __init__(self, world: World, rng: random.Random, messages: int, say: Callable[[str], None]):
        self.world, self.rng, self.messages, self.say = world, rng, messages, say
        self.keys = flow_keys(world.graph)
        self.sent: list[str] = []
        self.faults = 0
        self.promotions = 0
        self.killed_ahead = 0
        self.timeout = world.graph.cluster.session_timeout

    # -- what can happen now ----------------------------------------------
    def choices(self, faults: bool) -> list[tuple[float, str, Callable[[], str]]]:
        w, out = self.world, []
        if len(self.sent) < self.messages:
            out.append((3, "publish", self.publish))
        for sim in w.nodes.values():
            n = sim.node_id
            if sim.running() and sim.stream is not None and not sim.stream.held:
                out.append((4, f"read {n}", lambda sim=sim: sim.stream.step()))
            if sim.running() and sim.ahead is not None and sim.ahead.pending is not None:
                out.append((4, f"batch {n}", lambda sim=sim: sim.ahead.run()))
            if sim.running() and sim.node is not None:
                out.append((2, f"timers {n}", lambda sim=sim: self.timers(sim)))
                if sim.node.leadership is not None and sim.node.leadership.pending():
                    out.append((3, f"zookeeper {n}", lambda sim=sim: self.react(sim)))
            if not sim.alive:
                out.append((2, f"restart {n}", lambda sim=sim: w.start(sim, keep_disk=self.rng.random() < 0.8)))
        if w.net.deliverable(self.ready):
            out.append((3, "escalation", self.deliver))
        out.append((3, "time", lambda: self.advance(self.rng.uniform(0.02, 1.0))))
        out.append((0.5, "long time", lambda: self.advance(self.rng.uniform(1.0, 3 * self.timeout))))
        if faults and self.faults < MAX_FAULTS:
            out.append((1, "fault", self.fault))
        return out

    def step(self, faults: bool = True) -> str:
        options = self.choices(faults)
        total = sum(weight for weight, _, _ in options)
        pick = self.rng.uniform(0, total)
        for weight, name, act in options:
            pick -= weight
            if pick <= 0:
                break
        return f"{name}: {act()}"

    def ready(self, node_id: str) -> bool:
        return self.world.nodes[node_id].running()

    # -- actions ----------------------------------------------------------
    def publish(self) -> str:
        k = self.rng.randint(1, 6)
        start = len(self.sent)
        fresh = [order_or_payment(i) for i in range(start, min(start + k, self.messages))]
        docs, again = list(fresh), ""
        if start and self.rng.random() < 0.15:
            # A producer's retry: a message already sent, with its ID, again.
            # The flow processes it once; this copy must never leave the flow.
            docs.insert(self.rng.randint(0, len(docs)), order_or_payment(self.rng.randrange(start)))
            again = f" with {docs[0]['id'] if len(docs) == 1 else 'one'} sent before"
        self.world.publish(self.keys.uplink, [json.dumps(d).encode() for d in docs])
        self.sent.extend(d["id"] for d in fresh)
        return f"{len(docs)} messages ({docs[0]['id']}..{docs[-1]['id']}){again}"

    def timers(self, sim: SimNode) -> str:
        wait = sim.node.timer_round()
        return f"next round in {wait:.3f} s" if wait is not None else "stopped"

    def react(self, sim: SimNode) -> str:
        # A promotion waits for the node's batch lock, which a batch running ahead holds
        # until it ends: that batch runs first (a real one finishes on its own thread).
        sim.ahead.run()
        before = self.world.zk.epoch
        sim.node.leadership.react()
        if self.world.zk.epoch != before:
            self.promotions += 1
        return f"role {sim.node.role}, epoch {sim.node.epoch}"

    def deliver(self) -> str:
        w = self.world
        ready = w.net.deliverable(self.ready)
        index = ready[self.rng.randrange(min(3, len(ready)))]  # reordered among the first few
        batch = w.net.take(index)
        roll = self.rng.random()
        if roll < 0.1:
            return f"{batch.source}->{batch.target} epoch {batch.epoch}: {len(batch.claims)} claims dropped"
        if roll < 0.2:
            w.net.put(batch)  # it arrives again later
        target = w.nodes[batch.target].node
        try:
            # As the node's EscalationServicer does: admitted from the master, then claimed.
            why = target.admit_escalation(batch.source, batch.epoch)
            if why is not None:
                return f"{batch.source}->{batch.target} epoch {batch.epoch}: refused ({why})"
            released = target.on_claims(batch.epoch, batch.claims)
        except Exception as exc:
            return f"{batch.source}->{batch.target} epoch {batch.epoch}: refused ({exc})"
        dup = " (duplicated)" if roll < 0.2 else ""
        return f"{batch.source}->{batch.target} epoch {batch.epoch}: {len(batch.claims)} claims{dup}, {released} released"

    def advance(self, seconds: float) -> str:
        self.world.advance(seconds)
        return f"{seconds:.3f} s"

    def fault(self) -> str:
        w, rng = self.world, self.rng
        alive = [s for s in w.nodes.values() if s.alive]
        if not alive:
            return "none (every node is down)"
        # The master more often than not: its faults are the ones that test failover and fencing.
        masters = [s for s in alive if s.node is not None and s.node.role == "master"]
        sim = rng.choice(masters if masters and rng.random() < 0.6 else alive)
        n, kind = sim.node_id, rng.choice(["kill", "pause", "zookeeper", "redis-down", "redis-replies",
                                           "escalation"])
        self.faults += 1
        if kind == "kill":
            ahead = sim.ahead is not None and sim.ahead.pending is not None
            self.killed_ahead += ahead
            w.kill(sim)
            return (f"killed {n} ({'master' if w.zk.leader() == n else 'worker'})"
                    + (" with a batch running ahead of its checkpoint" if ahead else ""))
        duration = rng.uniform(0.2, 3 * self.timeout)
        if kind == "pause":
            sim.paused_until = w.clock.now() + duration
            w.add_fault(f"{n} paused", duration, lambda: None)
        elif kind == "zookeeper":
            sim.zk_cut = True
            w.add_fault(f"{n} cut from ZooKeeper", duration, lambda: setattr(sim, "zk_cut", False))
        elif kind in ("redis-down", "redis-replies"):
            link = sim.redis_link
            mode = link.fault = "down" if kind == "redis-down" else "lost_replies"
            w.add_fault(f"{n}'s Redis link {mode}", duration,
                        lambda: setattr(link, "fault", None if link.fault == mode else link.fault))
        else:
            w.net.cut.add(n)
            w.add_fault(f"{n}'s escalation links cut", duration, lambda: w.net.cut.discard(n))
        return f"{kind} {n} for {duration:.2f} s"

    def heal(self) -> None:
        """End every fault and start every dead node again (with its disk)."""
        w = self.world
        w.heal_due(everything=True)
        for sim in w.nodes.values():
            sim.paused_until = float("-inf")
            if not sim.alive:
                self.say(f"restart {sim.node_id}: {w.start(sim)}")


def run_once(seed: int, steps: int = 200, messages: int = 40, flow_text: str | None = None,
             settle_s: float = 120.0, verbose: bool = False) -> RunResult:
    """One seeded run; see the module docstring."""
    rng = random.Random(seed)
    trace: list[str] = []
    graph = parse_graph(flow_text or CHAINED.read_text(), "simulated flow")
    workdir = Path(tempfile.mkdtemp(prefix="twinflow-sim-"))
    quiet = logging.getLogger("twinflow")
    level = quiet.level
    if not verbose:
        quiet.setLevel(logging.CRITICAL)
    result = RunResult(seed, steps, 0, 0, 0, 0, trace=trace)
    try:
        world = World(graph, workdir, trace.append)
        schedule = Schedule(world, rng, messages, world.say)
        checker = Checker(world)
        for sim in world.nodes.values():
            world.say(f"start {sim.node_id}: {world.start(sim)}")
        for i in range(steps):
            if not _step(world, schedule, checker, result, i, faults=True):
                return result
        schedule.heal()
        end = world.clock.now() + settle_s
        i = steps
        while world.clock.now() < end:
            if len(schedule.sent) == messages and set(schedule.sent) <= checker.left.keys():
                break
            if not _step(world, schedule, checker, result, i, faults=False):
                return result
            i += 1
        sent = set(schedule.sent)
        lost = sorted(sent - checker.left.keys())
        result.sent, result.left, result.lost = len(sent), len(sent & checker.left.keys()), len(lost)
        result.duplicated = sum(c - 1 for c in checker.left.values() if c > 1)
        unexpected = sorted(checker.left.keys() - sent)
        if lost:
            result.problems.append(f"{len(lost)} messages never left the flow within {settle_s:.0f} s after the "
                                   f"faults ended: {', '.join(lost[:10])}")
        if unexpected:
            result.problems.append(f"messages that were never sent left the flow: {', '.join(unexpected[:10])}")
        result.faults, result.promotions = schedule.faults, schedule.promotions
        result.killed_ahead = schedule.killed_ahead
        return result
    finally:
        quiet.setLevel(level)
        shutil.rmtree(workdir, ignore_errors=True)


def _step(world: World, schedule: Schedule, checker: Checker, result: RunResult, i: int, faults: bool) -> bool:
    world.begin_step()
    t = world.clock.now() - START_TIME
    try:
        did = schedule.step(faults)
    except SimulationStuck as exc:
        result.problems.append(f"step {i}: {exc}")
        return False
    except Exception as exc:  # the node code (or a model) broke: a failed run with its traceback
        result.problems.append(f"step {i}: {type(exc).__name__}: {exc}")
        result.trace.append(traceback.format_exc())
        return False
    result.trace.append(f"{t:9.3f} step {i}: {did}")
    problems = checker.check()
    if problems:
        result.problems.extend(f"step {i}: {p}" for p in problems)
        result.duplicated = sum(c - 1 for c in checker.left.values() if c > 1)
        return False
    return True


def _chunk(seeds: range, steps: int, messages: int, flow_text: str | None) -> tuple[Counter, list[RunResult]]:
    totals, failures = Counter(), []
    for seed in seeds:
        r = run_once(seed, steps, messages, flow_text)
        totals.update(runs=1, sent=r.sent, faults=r.faults, promotions=r.promotions, lost=r.lost,
                      duplicated=r.duplicated, killed_ahead=r.killed_ahead)
        if not r.passed:
            failures.append(r)
    return totals, failures


def simulate(seed: int = 1, runs: int = 1000, steps: int = 200, messages: int = 40, flow_text: str | None = None,
             jobs: int = 1, chunk: int = 50, say: Callable[[str], None] = lambda text: None) -> dict:
    """``runs`` runs with seeds ``seed`` .. ``seed + runs - 1`` on ``jobs`` processes; returns the
    totals and every failed run (with its trace)."""
    began = time.monotonic()
    chunks = [range(s, min(s + chunk, seed + runs)) for s in range(seed, seed + runs, chunk)]
    totals: Counter = Counter()
    failures: list[RunResult] = []

    def add(part: tuple[Counter, list[RunResult]]) -> None:
        totals.update(part[0])
        failures.extend(part[1])
        say(f"{totals['runs']}/{runs} runs, {len(failures)} failed, {time.monotonic() - began:.0f} s")

    if jobs <= 1:
        for c in chunks:
            add(_chunk(c, steps, messages, flow_text))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for part in pool.map(functools.partial(_chunk, steps=steps, messages=messages, flow_text=flow_text),
                                 chunks):
                add(part)
    failures.sort(key=lambda r: r.seed)
    return {"runs": totals["runs"], "seconds": round(time.monotonic() - began, 1), "failed": len(failures),
            "sent": totals["sent"], "faults": totals["faults"], "promotions": totals["promotions"],
            "killed_ahead": totals["killed_ahead"], "lost": totals["lost"], "duplicated": totals["duplicated"], "failures": failures}
