"""The failover simulator's schedule: the seeded choices of one run, what can happen at each
step and how often, and the actions themselves (publish, read, deliver escalations, advance
time, and the faults: kill, pause, cut from ZooKeeper, Redis or escalation, Redis failover).

It holds :class:`Schedule` only; the run loop (``simulator.py``) calls ``step()``. Under
failure it promises determinism: every choice comes from the run's seeded random source, so
the same seed gives the same schedule and the same faults; at most ``MAX_FAULTS`` faults per
run, and ``heal()`` ends them all and restarts every dead peer (with its disk).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Callable

from ...cluster.master_flow import MasterFlow
from ...runtime.store.flow_store import FlowStore
from ...testing.flow_messages import CHAINED_MESSAGES
from ...cluster.on_cluster import flow_keys
from . import hostile
from .checker import duplicate_exit
from .world import Killed, SimPeer, World

MAX_FAULTS = 5


class Schedule:
    """The seeded choices of one run."""

    def __init__(self, world: World, rng: random.Random, messages: int, say: Callable[[str], None],
                 source=CHAINED_MESSAGES):
        self.world, self.rng, self.messages, self.say = world, rng, messages, say
        # What the producer publishes: the built-in orders and payments, or a --flow file's own
        # messages (twinflow/testing/flow_messages.py): message i, its ID, a document re-sent.
        self.source = source
        self.keys = flow_keys(world.graph)
        self.sent: list[str] = []
        self.published: Counter = Counter()   # ID -> times the producer published it
        self.good: dict[str, str] = {}         # uplink position -> ID, for the flow's own messages
        self.hostiles: dict[str, str | None] = {}  # uplink position -> the ID it may leave under
        self.docs: dict[str, dict] = {}        # ID -> document, for the flow's own messages
        self.first_published: dict[str, float] = {}  # business identifier -> when first published
        self.resent: dict[str, float] = {}     # re-sent ID -> when its identifier was first published
        # Whether an ID has left the flow (the checker's count, set by the run loop): a document
        # is re-sent only once it left, so its history entry is committed (Checker).
        self.has_left: Callable[[str], bool] = lambda mid: False
        self.exit = duplicate_exit(world.graph)
        self.counts: Counter = Counter()
        self.faults = 0
        self.killed_ahead = 0
        self.timeout = world.graph.cluster.session_timeout
        # A rolling restart under way: what is left of it, (action, peer) in order.
        self.rolling: list[tuple[str, SimPeer]] = []
        self.rolling_rng = random.Random(rng.random()) if world.dims.rolling else None
        # Seeded from the schedule's state without drawing from it: runs without timer faults
        # take the same choices as before they existed.
        self.timer_rng = random.Random(hash(rng.getstate()[1])) if world.dims.timer_faults else None

    # -- what can happen now ----------------------------------------------
    def choices(self, faults: bool) -> list[tuple[float, str, Callable[[], str]]]:
        w, out = self.world, []
        if len(self.sent) < self.messages:
            out.append((3, "publish", self.publish))
        for sim in w.peers.values():
            n = sim.peer_id
            if sim.running() and sim.stream is not None and not sim.stream.held:
                out.append((4, f"read {n}", lambda sim=sim: sim.stream.step()))
            if sim.running() and sim.ahead is not None and sim.ahead.pending is not None:
                out.append((4, f"batch {n}", lambda sim=sim: sim.ahead.run()))
            if sim.running() and sim.member is not None:
                out.append((2, f"timers {n}", lambda sim=sim: self.timers(sim)))
                if w.zookeeper_pending(sim):
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
        if self.rolling and self._roll_ready():
            out.append((3, "rolling restart", self.roll))
        if w.dims.log_trim:
            out.append((1, "change log trimmed", self.trim_log))
        g = w.guarded
        if g is not None:
            if faults and not g.down and self.faults < MAX_FAULTS:
                out.append((0.3, "ledger down", self.ledger_down))
            if faults and len(self.sent) < self.messages and self.faults < MAX_FAULTS:
                out.append((0.6, "ledger refuses", self.ledger_refuses))
            if g.suspended():
                out.append((1, "resume", g.resume))
            if g.failed():
                out.append((0.5, "resubmit", g.resubmit))
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

    def ready(self, peer_id: str) -> bool:
        return self.world.peers[peer_id].running()

    # -- actions ----------------------------------------------------------
    def publish(self) -> str:
        k = self.rng.randint(1, 6)
        start = len(self.sent)
        source, id_of = self.source, self.source.id_of
        fresh = [source.doc(i) for i in range(start, min(start + k, self.messages))]
        docs, again = list(fresh), ""
        if start and self.rng.random() < 0.15:
            # A producer's retry: a message already sent, with its ID, again. The flow processes
            # it once (once more only if its ID expired from the ID cache meanwhile).
            docs.insert(self.rng.randint(0, len(docs)), source.doc(self.rng.randrange(start)))
            again = f" with {id_of(docs[0]) if len(docs) == 1 else 'one'} sent before"
        bodies = [json.dumps(d).encode() for d in docs]
        ids: list[str | None] = [id_of(d) for d in docs]
        bad = ""
        if self.world.dims.hostile and self.rng.random() < self.world.dims.hostile:
            for _ in range(self.rng.randint(1, 2)):
                self.counts["hostile_sent"] += 1
                body, hid, what = hostile.make(self.rng, self.counts["hostile_sent"])
                at = self.rng.randint(0, len(bodies))
                bodies.insert(at, body)
                ids.insert(at, ("hostile", hid))
                bad += f"; hostile {what}"
        if self.world.dims.resend and self.exit is not None and source.resends \
                and self.rng.random() < self.world.dims.resend:
            doc, of = self.resend()
            if doc is not None:
                at = self.rng.randint(0, len(bodies))
                bodies.insert(at, json.dumps(doc).encode())
                ids.insert(at, id_of(doc))
                docs.insert(at, doc)
                bad += f"; {id_of(doc)} re-sends the document of {of}"
        positions = self.world.publish(self.keys.uplink, bodies)
        now = self.world.clock.now()
        for position, mid in zip(positions, ids):
            if isinstance(mid, tuple):
                self.hostiles[position] = mid[1]
            else:
                self.good[position] = mid
                self.published[mid] += 1
        for d in docs:
            self.docs.setdefault(id_of(d), d)
            if self.exit is not None:
                self.first_published.setdefault(str(d.get(self.exit.uuid_field)), now)
        self.sent.extend(id_of(d) for d in fresh)
        span = f" ({id_of(docs[0])}..{id_of(docs[-1])})" if docs else ""
        return f"{len(bodies)} messages{span}{again}{bad}"

    def resend(self) -> tuple[dict | None, str | None]:
        """A business re-send: the document of a message that already left the flow, under a new
        message ID (a client that sends an order again). The history must call it a duplicate
        while it holds the first (Checker). Returns the document and the ID it re-sends, or
        (None, None) when nothing has left yet."""
        left = [mid for mid in self.docs if mid not in self.resent and self.has_left(mid)]
        if not left:
            return None, None
        # Half of them among the latest: a new master that missed the last steps shows there.
        of = self.rng.choice(left[-5:] if self.rng.random() < 0.5 else left)
        self.counts["resent"] += 1
        doc = self.source.resent(self.docs[of], self.counts["resent"])
        self.resent[self.source.id_of(doc)] = self.first_published[str(doc.get(self.exit.uuid_field))]
        return doc, of

    def all_sent(self) -> list[str]:
        """Every ID the flow must see leave: the producer's messages and the re-sends."""
        return [*self.sent, *self.resent]

    def zombie(self) -> str:
        from .sharding import run_zombie
        self.counts["lost_attempts_run"] += 1
        return run_zombie(self.world)

    def trim_log(self) -> str:
        """What the COMMIT's MAXLEN does to a worker that fell behind, often: the change log cut
        to its last few entries (the simulated Redis ignores an approximate MAXLEN)."""
        keep = self.rng.randint(0, 3)
        cut = self.world.redis.xtrim(self.keys.changes, maxlen=keep, approximate=False)
        self.counts["change_log_trimmed"] += cut
        return f"{cut} entries cut, {keep} kept"

    def replicate(self) -> str:
        n = self.world.replica.behind
        self.world.replica.catch_up()
        return f"the replica caught up ({n} writes)"

    def while_writing(self, sim: SimPeer, when: str) -> str | None:
        """Something that happens while ``sim``'s COMMIT is in flight (``World.interleave``)."""
        w, rng = self.world, self.rng
        others = [o for o in w.peers.values() if o is not sim and o.running() and o.member is not None
                  and o.peer_id not in w.busy]
        options: list[tuple[str, Callable[[], str]]] = [
            ("time", lambda: self.advance(rng.uniform(0.01, 1.5 * self.timeout))),
        ]
        if len(self.sent) < self.messages:
            options.append(("publish", self.publish))
        member = sim.member
        if member is not None and member.leadership is not None and member.leadership.is_master \
                and w.zookeeper_pending(sim):
            options.append(("zookeeper (the writer)", lambda: self._react_writer(sim)))
        if member is not None:
            options.append(("timers (the writer)", lambda: self.timers(sim)))
        for o in others:
            if w.zookeeper_pending(o):
                options.append((f"zookeeper {o.peer_id}", lambda o=o: self.react(o)))
            if o.stream is not None and not o.stream.held:
                options.append((f"read {o.peer_id}", lambda o=o: o.stream.step()))
        if w.replica is not None:
            options.append(("redis failover", self.failover))
        if rng.random() < 0.05:
            options.append(("kill the writer", lambda: self._kill_writer(sim, when)))
        name, act = options[rng.randrange(len(options))]
        try:
            return f"{name}: {act()}"
        except Killed as exc:
            if exc.peer_id == sim.peer_id:
                raise
            return f"{name}: {exc}"  # another writer, killed inside what happened here

    def _failure_positions(self) -> set[str]:
        return {f[b"position"].decode() for _, f in self.world.redis.xrange(self.keys.failure) if b"position" in f}

    def _react_writer(self, sim: SimPeer) -> str:
        # Its ZooKeeper threads run while its batch thread waits for Redis (a promotion of its
        # own, after a step-down, waits for the batch lock the batch holds).
        self.world.zookeeper_acts(sim)
        return f"role {sim.member.role}" if sim.member is not None else "the process is gone"

    def _kill_writer(self, sim: SimPeer, when: str) -> str:
        ahead = sim.ahead is not None and sim.ahead.running
        self.killed_ahead += ahead
        self.world.kill(sim)
        self.faults += 1
        raise Killed(sim.peer_id, f"{sim.peer_id} killed with its COMMIT in flight ({when} Redis)"
                     + (" with a batch running ahead of its checkpoint" if ahead else ""))

    def failover(self) -> str:
        # Which failure records the failover erases (written and erased within one step too).
        before = self._failure_positions()
        lost = self.world.replica.failover()
        self.world.erased_failures.update(before - self._failure_positions())
        self.counts["failovers"] += 1
        self.counts["failover_lost_writes"] += lost
        return f"Redis failed over to its replica, losing {lost} unreplicated writes"

    def timers(self, sim: SimPeer) -> str:
        fault = self._timer_fault(sim) if self.timer_rng is not None else ""
        wait = sim.member.timer_round()
        return fault + (f"next round in {wait:.3f} s" if wait is not None else "stopped")

    def _timer_fault(self, sim: SimPeer) -> str:
        """Now and then, what a round may meet: a master's flow dropped (as a step that failed
        with an error leaves it: its deadlines must fire all the same, also with no batch
        after it), or the reader's next pace failing (the round, or a promotion, must bear it)."""
        if self.timer_rng.random() >= self.world.dims.timer_faults:
            return ""
        self.counts["timer_faults"] += 1
        session = sim.member.session
        if session is not None and session.flow is not None and self.timer_rng.random() < 0.7:
            session.drop()
            return "the master's flow dropped; "
        if sim.stream is not None:
            sim.stream.pace_fails = True
            return "the reader's next pace fails; "
        return ""

    def react(self, sim: SimPeer) -> str:
        # A promotion waits for the member's batch lock, which a batch running ahead holds
        # until it ends: that batch runs first (a real one finishes on its own thread).
        ran = sim.ahead.run()
        if sim.member is None:  # the batch's failure (or a kill while its COMMIT was in flight) ended the process
            return f"its batch first: {ran}; the process is gone"
        before = self.world.epoch()[0]
        self.world.zookeeper_acts(sim)
        if sim.member is None:  # killed while its own COMMIT was in flight (the writer's election thread)
            return "the process is gone"
        epoch = self.world.epoch()[0]
        session = sim.member.session
        if session is not None and session.flow is not None and session.epoch == epoch != before:
            # Whether it took the warm copy (no whole read) or read the state whole.
            warm = session.state_loads == 0
            self.counts["promotions_warm" if warm else "promotions_whole_read"] += 1
            if warm:
                self._same_as_redis(sim, session.flow)
        return f"role {sim.member.role}, epoch {sim.member.epoch}"

    def _same_as_redis(self, sim: SimPeer, flow: MasterFlow) -> None:
        """A master promoted on a warm copy starts from the state Redis holds: its version, mark
        and history verdict for every identifier published, against a whole read made now."""
        whole = MasterFlow.load(flow.graph, FlowStore(self.world.redis, flow.keys, "checker"))
        differ = [what for what, a, b in (("version", flow.version, whole.version), ("mark", flow.mark, whole.mark))
                  if a != b]
        for name in flow.logged:
            mine, theirs = flow.graph.nodes[name].store, whole.graph.nodes[name].store
            key = lambda ident: (flow.graph.nodes[name].trigger, ident)  # noqa: E731
            differ += [f"{name} {ident}" for ident in self.first_published
                       if mine.get(key(ident)) != theirs.get(key(ident))]
        if differ:
            self.world.stops.append(f"{sim.peer_id} was promoted on a warm copy that is not the state in "
                                    f"Redis: {', '.join(differ[:5])}")

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
        target = w.peers[batch.target].member
        try:
            # As the peer's EscalationServicer does: admitted from the master, then claimed.
            why = target.admit_escalation(batch.source, batch.epoch)
            if why is not None:
                return f"{batch.source}->{batch.target} epoch {batch.epoch}: refused ({why})"
            released = target.on_claims(batch.epoch, batch.claims)
        except Exception as exc:
            return f"{batch.source}->{batch.target} epoch {batch.epoch}: refused ({exc})"
        self._check_claims_released(batch)
        dup = " (duplicated)" if roll < 0.2 else ""
        return f"{batch.source}->{batch.target} epoch {batch.epoch}: {len(batch.claims)} claims{dup}, {released} released"

    def _check_claims_released(self, batch) -> None:
        """A claim the worker took must release the message it names once Redis shows that message
        processed: the claim's ruleset, ID and key are the ones the worker baked it under. (Redis
        is the record, so a wrong claim costs no message; what it costs is a processed message
        held until the mark passes it, surfaced as unclaimed on the way. This is where it shows.)"""
        target = self.world.peers[batch.target].member
        if target.role == "master":
            return  # a master holds nothing: its promotion rolled the bake back
        left = [(c, m) for c in batch.claims if (m := target.claims.sort.held_at(c[2])) is not None]
        if not left:
            return
        try:
            proven = target.store.processed([m for _, m in left], deadline_s=0)
        except Exception:  # Redis away: the worker could not prove them either
            return
        wrong = [f"{m.id} (claim {c[0]!r} of {c[3]!r}, baked as {m.cid!r} of {m.rule!r})"
                 for (c, m), ok in zip(left, proven) if ok]
        if wrong:
            self.world.stops.append(f"{batch.target} took claims that left their processed messages held: "
                                    f"{', '.join(wrong[:3])}")

    def advance(self, seconds: float) -> str:
        self.world.advance(seconds)
        return f"{seconds:.3f} s"

    def fault(self) -> str:
        w, rng = self.world, self.rng
        alive = [s for s in w.peers.values() if s.alive]
        if not alive:
            return "none (every peer is down)"
        if self.rolling_rng is not None and not self.rolling and len(alive) == len(w.peers) \
                and self.rolling_rng.random() < w.dims.rolling:
            return self.rolling_restart()
        # The master more often than not: its faults are the ones that test failover and fencing.
        masters = [s for s in alive if s.member is not None and s.member.role == "master"]
        sim = rng.choice(masters if masters and rng.random() < 0.6 else alive)
        n, kind = sim.peer_id, rng.choice(["kill", "pause", "zookeeper", "redis-down", "redis-replies",
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
            return (f"killed {n} ({'master' if w.leader() == n else 'worker'})"
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

    # -- a rolling restart ---------------------------------------------------------
    def rolling_restart(self) -> str:
        """Plan a rolling restart, as an operator (or the host drill) does it: the worker stopped
        gracefully and started again, then, once it streams, the master (whose graceful stop
        hands the role over); traffic goes on meanwhile. Each action is a step of its own."""
        w = self.world
        order = sorted(w.peers.values(), key=lambda s: s.member is not None and s.member.role == "master")
        self.rolling = [(action, sim) for sim in order for action in ("stop", "start")]
        self.faults += 1
        self.counts["rolling_restarts"] += 1
        return f"rolling restart: {order[0].peer_id}, then {order[1].peer_id}"

    def _roll_ready(self) -> bool:
        action, sim = self.rolling[0]
        if action == "start" or not sim.alive:
            return True
        # The next peer stops once the one restarted before it streams (the drill waits for it).
        done = [s for s in self.world.peers.values() if s is not sim and s.alive]
        return sim.running() and all(s.member is not None and s.member.streaming for s in done)

    def roll(self) -> str:
        action, sim = self.rolling.pop(0)
        if (action == "stop") != sim.alive:  # killed, or restarted already, by another fault
            return f"{sim.peer_id}: nothing to {action} ({'running' if sim.alive else 'down'})"
        if action == "stop":
            return f"{sim.peer_id} {self.world.stop(sim)}"
        return f"start {sim.peer_id}: {self.world.start(sim)}"

    def ledger_refuses(self) -> str:
        """Orders the ledger refuses: the next few the producer publishes."""
        self.faults += 1
        upto = min(self.messages, len(self.sent) + 3)
        return "; ".join(self.world.guarded.refuse(self.source.id_of(self.source.doc(i)))
                         for i in range(len(self.sent), upto))

    def ledger_down(self) -> str:
        self.faults += 1
        return self.world.guarded.go_down(self.rng.uniform(1.0, 60.0))

    def heal(self) -> None:
        """End every fault (a rolling restart under way ends with its peers started) and start
        every dead peer again (with its disk)."""
        w = self.world
        self.rolling = []
        w.heal_due(everything=True)
        if w.guarded is not None:
            said = w.guarded.heal()
            if said:
                self.say(f"the ledger takes every order again: {said}")
        for sim in w.peers.values():
            sim.paused_until = float("-inf")
            if not sim.alive:
                self.say(f"restart {sim.peer_id}: {w.start(sim)}")
