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

import yaml

from ...testing.messages import order_or_payment
from ...cluster.master_flow import outlink_streams
from ...cluster.on_cluster import flow_keys
from ...runtime.flowgraph import parse_graph
from ...runtime.shards import shard_graph
from ...testing.checker import Tally, read_sink_after
from . import hostile
from .redis_model import virtual_time
from .world import START_TIME, Dims, Killed, SimNode, SimulationStuck, World

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
CHAINED = EXAMPLES / "cluster-chained.yaml"
KINDS = {"pair": EXAMPLES / "cluster.yaml", "chained": CHAINED, "sharded": EXAMPLES / "cluster-sharded.yaml"}
MAX_FAULTS = 5


def draw_dims(seed: int, sharded: bool, wait: bool = True, only: dict | None = None) -> tuple[Dims, dict]:
    """The run's dimensions and the flow settings it overrides, from its seed (a random source of
    their own, so that the schedule's choices do not move them). ``only`` fixes some (tests)."""
    rng = random.Random(seed * 7919 + 17)
    d = Dims(sharded=sharded, wait=wait)
    d.overlap = rng.choice([0.0, 0.5, 0.9])
    d.interleave = rng.choice([0.0, 0.3, 0.7]) if d.overlap else 0.0
    d.hostile = rng.choice([0.0, 0.2, 0.5])
    d.replica = rng.random() < 0.4
    d.trim_interval_s = rng.choice([0.5, 2.0, 10.0])
    if sharded:
        d.speculation = rng.choice([0.1, 0.3])
        d.lost_attempt = rng.choice([0.05, 0.15])
    flow = {"id_ttl": rng.choice([5, 20, 60, None]), "retention": rng.choice([0, 2, 30, None])}
    for k, v in (only or {}).items():
        if k in flow:
            flow[k] = v
        else:
            setattr(d, k, v)
    return d, flow


def flow_for(text: str, dims: Dims, flow: dict) -> str:
    """The flow file with the run's settings: ID-cache TTL, uplink retention, wait_replicas."""
    doc = yaml.safe_load(text)
    if flow.get("id_ttl") is not None:
        doc.setdefault("message", {})["id_ttl"] = flow["id_ttl"]
    if flow.get("retention") is not None:
        doc.setdefault("uplink", {})["retention"] = flow["retention"]
    if dims.replica and dims.wait:
        doc.setdefault("cluster", {})["wait_replicas"] = 1
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


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
    kind: str = "chained"
    dims: str = ""
    counts: Counter = field(default_factory=Counter)  # what each dimension did (see Checker and Schedule)
    expected: list[str] = field(default_factory=list)  # without WAIT: what a failover cost (not a failure)

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {"seed": self.seed, "steps": self.steps, "sent": self.sent, "left": self.left, "lost": self.lost,
                "duplicated": self.duplicated, "faults": self.faults, "promotions": self.promotions,
                "killed_ahead": self.killed_ahead, "passed": self.passed, "problems": self.problems[:5],
                "kind": self.kind, "dims": self.dims, "counts": dict(self.counts), "expected": self.expected[:5]}


class Checker:
    """Reads each output stream and the failure stream from where it left off and checks the
    step-wise promises.

    Re-published IDs and ID expiry: a producer's retry of a message whose ID expired from the ID
    cache (``message.id_ttl``) is a new message to the flow, and may leave again; any other
    second leave is a duplicate. The second leave is taken as after expiry only when the check
    that saw it is at least ``id_ttl`` after the first COMMIT that put the ID in the cache (the
    Redis model records when, ``World.cached_at``), and only for IDs the producer published more
    than once.

    Hostile messages (``hostile.py``) leave exactly once, through the flow (by their ID) or by
    the failure path (by their uplink position, with a reason); never both, never neither.

    Redis failover (``Replica.failover``): the streams are read again from the start, since a
    failover may erase their last entries. With ``wait_replicas`` it must erase no output;
    without, what it erased is counted (``RunResult.counts``).
    """

    def __init__(self, world: World, published: Counter, hostiles: dict, good: dict, id_ttl: float):
        keys = flow_keys(world.graph)
        self.id_prefix = keys.id_prefix
        self.world = world
        self.streams = list(outlink_streams(world.graph, keys).values())
        self.failure = keys.failure
        self.after = {s: "0-0" for s in [*self.streams, self.failure]}
        self.tally = Tally()                         # the shared counting core: leavings, writers per epoch
        self.failed: Counter = Counter()             # uplink position -> records on the failure stream
        self.first_left: dict[str, float] = {}
        self.first_failed: dict[str, float] = {}
        self.published, self.hostiles, self.good, self.id_ttl = published, hostiles, good, id_ttl
        self.allowed: Counter = Counter()            # leaves excused by ID expiry, per ID
        self.counts: Counter = Counter()
        self._commits_seen = -1
        self._records_seen = -1
        self._failovers = 0
        self.erased_failures: set[str] = set()   # positions whose failure record a failover erased
        self.step_began = START_TIME

    @property
    def left(self) -> Counter:
        """Message ID -> times it left the flow."""
        return self.tally.left

    def _resync(self, problems: list[str]) -> None:
        """After a Redis failover: what left is what the streams hold now."""
        before = self.tally.left
        self.tally.left = Counter()
        for stream in self.streams:
            self.after[stream] = "0-0"
        self._read_outputs([], recount=True)
        erased = before - self.left
        if erased:
            n = sum(erased.values())
            self.counts["failover_erased_outputs"] += n
            if self.world.dims.wait:
                problems.append(f"a Redis failover erased {n} outputs that had left the flow with "
                                f"wait_replicas set ({', '.join(sorted(erased)[:5])})")
        self.after[self.failure] = "0-0"
        before_failed, self.failed = self.failed, Counter()
        self._read_failures([], recount=True)
        gone = before_failed - self.failed
        if gone:
            self.counts["failover_erased_failures"] += sum(gone.values())
            self.erased_failures.update(gone)

    def check(self) -> list[str]:
        problems: list[str] = []
        replica = self.world.replica
        if replica is not None and replica.failovers != self._failovers:
            self._failovers = replica.failovers
            self._resync(problems)
        if self.world.commits[1] != self._records_seen:
            self._records_seen = self.world.commits[1]
            self._read_failures(problems)
        while self.world.stops:
            problems.append(self.world.stops.pop(0))
        if self.world.commits[0] == self._commits_seen:
            return problems  # no commit since the last check: no output can have been written
        self._commits_seen = self.world.commits[0]
        self._read_outputs(problems)
        return problems

    def _read_outputs(self, problems: list[str], recount: bool = False) -> None:
        now = self.world.clock.now()
        for stream in self.streams:
            for position, e in read_sink_after(self.world.redis, stream, self.after[stream]):
                self.after[stream] = position
                again = self.tally.count(e)
                for member in e.id.split("+"):
                    self.first_left.setdefault(member, self.step_began)
                    if recount:
                        continue
                    if member in again:
                        if self._expired_again(member, now):
                            continue
                        problems.append(f"{member} left the flow {self.left[member]} times "
                                        f"(again via {stream}, node {e.node}, epoch {e.epoch})")
                    if member in self.failed_ids():
                        problems.append(f"{member} left the flow and by the failure path")
                if recount:
                    continue
                problems.extend(self.tally.judge_writer(e))

    def _expired_again(self, member: str, now: float) -> bool:
        """A second leave that a re-published message may make once its ID expired."""
        extra = self.left[member] - 1
        # Only id_ttl after the first COMMIT that put it in the ID cache can it be new again.
        since = self.world.cached_at.get(self.id_prefix + member)
        if (since is not None and now - since >= self.id_ttl and self.published[member] > extra
                and self.allowed[member] < extra):
            self.allowed[member] += 1
            self.counts["left_again_after_id_ttl"] += 1
            return True
        return False

    def failed_ids(self) -> set:
        return {self.hostiles.get(p) for p in self.failed} - {None}

    def _read_failures(self, problems: list[str], recount: bool = False) -> None:
        now = self.world.clock.now()
        entries = self.world.redis.xrange(self.failure, min="(" + self.after[self.failure])
        for eid, fields in entries:
            self.after[self.failure] = eid.decode()
            f = {k.decode(): v for k, v in fields.items()}
            position = f.get("position", b"").decode()
            reason = f.get("reason", b"").decode("utf-8", "replace")
            self.failed[position] += 1
            self.first_failed.setdefault(position, self.step_began)
            if recount:
                continue
            if not reason:
                problems.append(f"uplink entry {position} left by the failure path without a reason")
            if position in self.good:
                problems.append(f"a good message ({self.good[position]}, at {position}) left by the failure "
                                f"path: {reason}")
            elif position not in self.hostiles:
                problems.append(f"uplink entry {position}, never published, left by the failure path")
            if self.failed[position] > 1:
                if now - self.first_failed[position] >= self.id_ttl:
                    # Its seen-marker lives id_ttl: an entry read again after that is recorded again.
                    self.counts["failed_again_after_id_ttl"] += 1
                else:
                    problems.append(f"uplink entry {position} left by the failure path {self.failed[position]} "
                                    f"times ({reason})")
            hid = self.hostiles.get(position)
            if hid is not None and self.left[hid]:
                problems.append(f"{hid!r} (at {position}) left the flow and by the failure path ({reason})")


class Schedule:
    """The seeded choices of one run."""

    def __init__(self, world: World, rng: random.Random, messages: int, say: Callable[[str], None]):
        self.world, self.rng, self.messages, self.say = world, rng, messages, say
        self.keys = flow_keys(world.graph)
        self.sent: list[str] = []
        self.published: Counter = Counter()   # ID -> times the producer published it
        self.good: dict[str, str] = {}         # uplink position -> ID, for the flow's own messages
        self.hostiles: dict[str, str | None] = {}  # uplink position -> the ID it may leave under
        self.counts: Counter = Counter()
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
        if w.zombies:
            out.append((2, "lost attempt", self.zombie))
        if w.replica is not None and w.replica.behind:
            out.append((2, "replication", self.replicate))
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
            # A producer's retry: a message already sent, with its ID, again. The flow processes
            # it once (once more only if its ID expired from the ID cache meanwhile).
            docs.insert(self.rng.randint(0, len(docs)), order_or_payment(self.rng.randrange(start)))
            again = f" with {docs[0]['id'] if len(docs) == 1 else 'one'} sent before"
        bodies = [json.dumps(d).encode() for d in docs]
        ids: list[str | None] = [d["id"] for d in docs]
        bad = ""
        if self.world.dims.hostile and self.rng.random() < self.world.dims.hostile:
            for _ in range(self.rng.randint(1, 2)):
                self.counts["hostile_sent"] += 1
                body, hid, what = hostile.make(self.rng, self.counts["hostile_sent"])
                at = self.rng.randint(0, len(bodies))
                bodies.insert(at, body)
                ids.insert(at, ("hostile", hid))
                bad += f"; hostile {what}"
        positions = self.world.publish(self.keys.uplink, bodies)
        for position, mid in zip(positions, ids):
            if isinstance(mid, tuple):
                self.hostiles[position] = mid[1]
            else:
                self.good[position] = mid
                self.published[mid] += 1
        self.sent.extend(d["id"] for d in fresh)
        span = f" ({docs[0]['id']}..{docs[-1]['id']})" if docs else ""
        return f"{len(bodies)} messages{span}{again}{bad}"

    def zombie(self) -> str:
        from .sharding import run_zombie
        self.counts["lost_attempts_run"] += 1
        return run_zombie(self.world)

    def replicate(self) -> str:
        n = self.world.replica.behind
        self.world.replica.catch_up()
        return f"the replica caught up ({n} writes)"

    def while_writing(self, sim: SimNode, when: str) -> str | None:
        """Something that happens while ``sim``'s COMMIT is in flight (``World.interleave``)."""
        w, rng = self.world, self.rng
        others = [o for o in w.nodes.values() if o is not sim and o.running() and o.node is not None
                  and o.node_id not in w.busy]
        options: list[tuple[str, Callable[[], str]]] = [
            ("time", lambda: self.advance(rng.uniform(0.01, 1.5 * self.timeout))),
        ]
        if len(self.sent) < self.messages:
            options.append(("publish", self.publish))
        node = sim.node
        if node is not None and node.leadership is not None and node.leadership.is_master \
                and node.leadership.pending():
            options.append(("zookeeper (the writer)", lambda: self._react_writer(sim)))
        if node is not None:
            options.append(("timers (the writer)", lambda: self.timers(sim)))
        for o in others:
            if o.node.leadership is not None and o.node.leadership.pending():
                options.append((f"zookeeper {o.node_id}", lambda o=o: self.react(o)))
            if o.stream is not None and not o.stream.held:
                options.append((f"read {o.node_id}", lambda o=o: o.stream.step()))
        if w.replica is not None:
            options.append(("redis failover", self.failover))
        if rng.random() < 0.05:
            options.append(("kill the writer", lambda: self._kill_writer(sim, when)))
        name, act = options[rng.randrange(len(options))]
        try:
            return f"{name}: {act()}"
        except Killed as exc:
            if exc.node_id == sim.node_id:
                raise
            return f"{name}: {exc}"  # another writer, killed inside what happened here

    def _failure_positions(self) -> set[str]:
        return {f[b"position"].decode() for _, f in self.world.redis.xrange(self.keys.failure) if b"position" in f}

    def _react_writer(self, sim: SimNode) -> str:
        # Its kazoo threads run while its batch thread waits for Redis (as master it can only
        # notice, lose its session or finish a step-down: nothing that waits for the batch lock).
        sim.node.leadership.react()
        return f"role {sim.node.role}"

    def _kill_writer(self, sim: SimNode, when: str) -> str:
        ahead = sim.ahead is not None and sim.ahead.running
        self.killed_ahead += ahead
        self.world.kill(sim)
        self.faults += 1
        raise Killed(sim.node_id, f"{sim.node_id} killed with its COMMIT in flight ({when} Redis)"
                     + (" with a batch running ahead of its checkpoint" if ahead else ""))

    def failover(self) -> str:
        # Which failure records the failover erases (written and erased within one step too).
        before = self._failure_positions()
        lost = self.world.replica.failover()
        self.world.erased_failures.update(before - self._failure_positions())
        self.counts["failovers"] += 1
        self.counts["failover_lost_writes"] += lost
        return f"Redis failed over to its replica, losing {lost} unreplicated writes"

    def timers(self, sim: SimNode) -> str:
        wait = sim.node.timer_round()
        return f"next round in {wait:.3f} s" if wait is not None else "stopped"

    def react(self, sim: SimNode) -> str:
        # A promotion waits for the node's batch lock, which a batch running ahead holds
        # until it ends: that batch runs first (a real one finishes on its own thread).
        ran = sim.ahead.run()
        if sim.node is None:  # the batch's failure (or a kill while its COMMIT was in flight) ended the process
            return f"its batch first: {ran}; the process is gone"
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
                                           "escalation"] + (["redis-failover"] if w.replica is not None else [])
                                          + (["executor"] if w.dims.sharded else []))
        self.faults += 1
        if kind == "redis-failover":
            return self.failover()
        if kind == "executor":
            sim.executors = []
            return f"{n}'s executor processes replaced (kept flows gone)"
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


def kind_of(flow_text: str) -> str:
    graph = parse_graph(flow_text, "simulated flow")
    return "sharded" if graph.cluster is not None and graph.cluster.shards > 1 else "flow"


def run_once(seed: int, steps: int = 200, messages: int = 40, flow_text: str | None = None,
             settle_s: float = 120.0, verbose: bool = False, kind: str | None = None, wait: bool = True,
             only: dict | None = None) -> RunResult:
    """One seeded run; see the module docstring. ``kind``: pair, chained (the default) or
    sharded, or the flow in ``flow_text``; ``wait`` False: Redis failovers without
    ``wait_replicas`` (what they cost is counted in ``expected``, not failed); ``only`` fixes
    some of the run's dimensions (``draw_dims``)."""
    rng = random.Random(seed)
    trace: list[str] = []
    if flow_text is None:
        kind = kind or "chained"
        flow_text = KINDS[kind].read_text()
    else:
        kind = kind or kind_of(flow_text)
    sharded = kind == "sharded" or kind_of(flow_text) == "sharded"
    dims, settings = draw_dims(seed, sharded, wait, only)
    full = parse_graph(flow_for(flow_text, dims, settings), "simulated flow")
    graph = shard_graph(full, 0) if sharded else full
    workdir = Path(tempfile.mkdtemp(prefix="twinflow-sim-"))
    quiet = logging.getLogger("twinflow")
    level = quiet.level
    if not verbose:
        quiet.setLevel(logging.CRITICAL)
    result = RunResult(seed, steps, 0, 0, 0, 0, trace=trace, kind=kind,
                       dims=dims.describe() + f", id_ttl={graph.cluster.message.id_ttl}, "
                                              f"retention={graph.cluster.retention}")
    world = World(graph, workdir, lambda line: trace.append(line), dims, rng, full_graph=full)
    try:
        with virtual_time(world.clock.now):
            return _run(world, rng, result, steps, messages, settle_s)
    finally:
        quiet.setLevel(level)
        shutil.rmtree(workdir, ignore_errors=True)


def _run(world: World, rng: random.Random, result: RunResult, steps: int, messages: int,
         settle_s: float) -> RunResult:
    world.say(f"dimensions: {result.dims}")
    schedule = Schedule(world, rng, messages, world.say)
    world.interleave_hook = schedule.while_writing
    checker = Checker(world, schedule.published, schedule.hostiles, schedule.good,
                      world.graph.cluster.message.id_ttl)
    for sim in world.nodes.values():
        world.say(f"start {sim.node_id}: {world.start(sim)}")
    try:
        for i in range(steps):
            if not _step(world, schedule, checker, result, i, faults=True):
                return result
        schedule.heal()
        end = world.clock.now() + settle_s
        i = steps
        while world.clock.now() < end:
            if len(schedule.sent) == messages and set(schedule.sent) <= checker.left.keys() and all(
                    (h is not None and checker.left[h]) or checker.failed[p] for p, h in schedule.hostiles.items()):
                break
            if not _step(world, schedule, checker, result, i, faults=False):
                return result
            i += 1
        hostile_ids = {h for h in schedule.hostiles.values() if h is not None}
        report = checker.tally.report(schedule.sent, checker.allowed, may_leave=hostile_ids)
        result.sent, result.left, result.lost = report.sent, report.delivered, report.lost
        result.duplicated = report.duplicated
        lost, unexpected = report.lost_ids, report.unexpected_ids
        stuck = [p for p, h in schedule.hostiles.items()
                 if not ((h is not None and checker.left[h]) or checker.failed[p])]
        problems = []
        if lost:
            problems.append(f"{report.lost} messages never left the flow within {settle_s:.0f} s after the "
                            f"faults ended: {', '.join(lost[:10])}")
        erased = [p for p in stuck if p in checker.erased_failures or p in world.erased_failures]
        if erased:  # its failure record was written, then a failover erased it
            problems.append(f"{len(erased)} failure records erased by a Redis failover: at {', '.join(erased[:10])}")
        if stuck:
            problems.append(f"{len(stuck)} hostile messages never left, through the flow or by the failure "
                            f"path: at {', '.join(stuck[:10])}")
            result.lost += len(stuck)
        if unexpected:
            problems.append(f"messages that were never sent left the flow: {', '.join(map(repr, unexpected[:10]))}")
        _report(world, result, problems)
        return result
    finally:
        result.faults, result.promotions = schedule.faults, schedule.promotions
        result.killed_ahead = schedule.killed_ahead
        result.counts.update(schedule.counts)
        result.counts.update(checker.counts)
        result.counts["interleaved"] += world.interleaved
        result.counts["uplink_entries_trimmed"] += world.commits[2]
        if world.replica is not None:
            result.counts["replica_runs"] += 1


def _report(world: World, result: RunResult, problems: list[str]) -> None:
    """Problems fail the run, except after a Redis failover without wait_replicas, where they
    are what the failover cost (``expected``)."""
    if world.replica is not None and not world.dims.wait and world.replica.failovers:
        result.expected.extend(problems)
        result.counts["nowait_problems"] += len(problems)
    else:
        result.problems.extend(problems)


def _step(world: World, schedule: Schedule, checker: Checker, result: RunResult, i: int, faults: bool) -> bool:
    world.begin_step()
    t = world.clock.now() - START_TIME
    checker.step_began = world.clock.now()
    try:
        did = schedule.step(faults)
    except Killed as exc:
        did = f"{exc}"
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
        _report(world, result, [f"step {i}: {p}" for p in problems])
        if result.problems:
            result.duplicated = checker.tally.report((), checker.allowed).duplicated
            return False
    return True


def _chunk(seeds: range, steps: int, messages: int, flow_text: str | None, kind: str | None = None,
           wait: bool = True) -> tuple[Counter, list[RunResult]]:
    totals, failures = Counter(), []
    for seed in seeds:
        r = run_once(seed, steps, messages, flow_text, kind=kind, wait=wait)
        totals.update(runs=1, sent=r.sent, faults=r.faults, promotions=r.promotions, lost=r.lost,
                      duplicated=r.duplicated, killed_ahead=r.killed_ahead)
        totals.update({f"counts.{k}": v for k, v in r.counts.items()})
        if not r.passed:
            failures.append(r)
        elif r.expected and len(failures) < 200:
            failures.append(r)  # passed, with what a failover without WAIT cost: kept as a sample
    return totals, failures


def simulate(seed: int = 1, runs: int = 1000, steps: int = 200, messages: int = 40, flow_text: str | None = None,
             jobs: int = 1, chunk: int = 50, say: Callable[[str], None] = lambda text: None,
             kind: str | None = None, wait: bool = True) -> dict:
    """``runs`` runs with seeds ``seed`` .. ``seed + runs - 1`` on ``jobs`` processes; returns the
    totals and every failed run (with its trace)."""
    began = time.monotonic()
    chunks = [range(s, min(s + chunk, seed + runs)) for s in range(seed, seed + runs, chunk)]
    totals: Counter = Counter()
    failures: list[RunResult] = []

    samples: list[RunResult] = []

    def add(part: tuple[Counter, list[RunResult]]) -> None:
        totals.update(part[0])
        failures.extend(r for r in part[1] if not r.passed)
        samples.extend(r for r in part[1] if r.passed and len(samples) < 20)
        say(f"{totals['runs']}/{runs} runs, {len(failures)} failed, {time.monotonic() - began:.0f} s")

    if jobs <= 1:
        for c in chunks:
            add(_chunk(c, steps, messages, flow_text, kind, wait))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for part in pool.map(functools.partial(_chunk, steps=steps, messages=messages, flow_text=flow_text,
                                                   kind=kind, wait=wait), chunks):
                add(part)
    failures.sort(key=lambda r: r.seed)
    return {"runs": totals["runs"], "seconds": round(time.monotonic() - began, 1), "failed": len(failures),
            "sent": totals["sent"], "faults": totals["faults"], "promotions": totals["promotions"],
            "killed_ahead": totals["killed_ahead"], "lost": totals["lost"], "duplicated": totals["duplicated"],
            "kind": kind or "chained", "wait_replicas": wait,
            "counts": {k[7:]: v for k, v in sorted(totals.items()) if k.startswith("counts.")}, "failures": failures,
            "with_expected": samples}
