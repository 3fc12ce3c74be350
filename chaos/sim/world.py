"""One simulated cluster: the virtual clock, the server models, the peers and their faults.

A :class:`World` holds one Redis model, one ZooKeeper model, the escalation
links and two :class:`SimPeer` slots. A slot outlives the processes that
run in it: killing drops the slot's peer (no clean-up, as SIGKILL) and
restarting starts a new peer with the same ID, with its disk (the
checkpoint and state directory) or with a new one.

Time is virtual and moves only when the simulator advances it or when a
peer's store waits between retries (:meth:`World.wait`). Faults are
windows on that clock; a window that ends while a peer waits inside a
call heals at once, so a store that retries without a deadline always
returns.
"""

from __future__ import annotations

import itertools
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import fakeredis

from ...cluster.member import FlowMember
from ...cluster.peer import Peer

from ...cluster.peer_config import PeerConfig
from ...cluster.zk_paths import ZkPaths
from ...runtime.clock import FakeClock
from ...runtime.flowgraph import FlowGraph
from .escalation_model import EscalationNet
from .simulated_parts import SimParts, SimStream
from .redis_model import RedisLink, Replica, SimRedis
from .turns import SimLock, Turns
from .zookeeper_model import ZkModel

log = logging.getLogger("twinflow.sim")

START_TIME = 1_800_000_000.0   # virtual epoch seconds at the start of every run
MAX_WAITS_PER_STEP = 100_000


@dataclass
class Dims:
    """The dimensions one run exercises, drawn from its seed (``simulator.draw_dims``)."""

    overlap: float = 0.0        # chance that a COMMIT is held in flight while the next step is built
    interleave: float = 0.0     # chance that something else happens while a held COMMIT is in flight
    hostile: float = 0.0        # chance that a publish carries hostile messages
    replica: bool = False       # Redis has a replica, and failovers (that lose unreplicated writes) happen
    wait: bool = True           # with a replica: the flow sets cluster.wait_replicas: 1
    trim_interval_s: float = 10.0
    sharded: bool = False       # batches run on simulated executor processes (shard_task.run_shard)
    speculation: float = 0.0    # chance that a shard task runs a second attempt
    lost_attempt: float = 0.0   # chance that an attempt is declared lost and runs again later
    step_messages: int = 1000   # cluster.step_messages: below a batch's size, the master commits it in several steps
    resend: float = 0.0         # chance that a publish carries a document that left, under a new ID
    log_trim: bool = False      # the change log is trimmed to its last few entries at times
    skip_processed: bool = False  # readers start after the processed mark when it is further
    read_behind: bool = False   # with skip_processed: workers read behind, a promotion catches up to the newest entry
    rolling: float = 0.0        # chance that a fault is a rolling restart (graceful stop and start, one peer then the other)
    timer_faults: float = 0.0   # chance that a timer round meets a fault: the master's flow dropped, the pace failing
    handler_kill: float = 0.0   # guarded kind: chance that a master is killed inside a handler call (guarded.py)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.__dict__.items())


class Killed(BaseException):
    """The process whose thread this is was killed (SIGKILL) while its write was in flight: the
    thread goes no further (a BaseException, so that the peer code's handlers let it through)."""

    def __init__(self, peer_id: str, text: str):
        super().__init__(text)
        self.peer_id = peer_id


class SimulationStuck(BaseException):
    """A call kept waiting although every fault window had ended (a BaseException, so that
    the peer code's own ``except Exception`` does not swallow it)."""


@dataclass
class Fault:
    what: str
    until: float
    heal: Callable[[], None]


@dataclass
class SimPeer:
    world: "World"
    peer_id: str
    redis_link: RedisLink = field(default_factory=RedisLink)
    disk: dict = field(default_factory=dict)    # offset (the checkpoint), state_dir
    member: FlowMember | None = None  # the running peer's one member (None while down)
    stream: SimStream | None = None
    gen: int = 0                                # incarnations started so far
    alive: bool = False
    paused_until: float = float("-inf")
    zk_cut: bool = False
    ahead: Any = None                           # the incarnation's batch thread (stepped_threads.AheadBatch)
    executors: list = field(default_factory=list)  # sharded: this peer's executor processes (sharding.Executor)
    peer: Peer | None = None                    # the running process (None while down)
    threads: Any = None                         # its threads (turns.PeerThreads)
    zk: Any = None                              # its ZooKeeper client (kazoo_model.SimKazooClient)

    def running(self) -> bool:
        """Alive and not paused: the process can act."""
        return self.alive and self.world.clock.now() >= self.paused_until

    def zk_connected(self, gen: int) -> bool:
        """Incarnation ``gen`` is heard from by ZooKeeper (it runs, unpaused, link up)."""
        return self.gen == gen and self.running() and not self.zk_cut


class World:
    def __init__(self, graph: FlowGraph, workdir: Path, say: Callable[[str], None], dims: Dims | None = None,
                 rng: random.Random | None = None, full_graph: FlowGraph | None = None):
        self.graph = graph
        self.full_graph = full_graph or graph   # a sharded flow's whole graph (graph: the simulated shard's)
        self.dims = dims or Dims()
        self.rng = rng or random.Random(0)
        self.workdir = workdir
        self.clock = FakeClock(START_TIME)
        self.redis_server = fakeredis.FakeServer()
        self.commits = [0, 0, 0]   # COMMIT scripts (only they write outputs), RECORD_FAILURE scripts, entries trimmed
        self.replica = Replica(self.redis_server) if self.dims.replica else None
        self.cached_at: dict[str, float] = {}   # ID-cache key -> when a COMMIT first wrote it
        self.redis = SimRedis(self.redis_server, RedisLink(), replica=self.replica)  # the producer's and checker's
        self.busy: set[str] = set()    # peers with a write held in flight (see interleave)
        self.interleaved = 0
        self.skipped_reads = 0  # reads that skipped processed entries (Dims.skip_processed)
        self.interleave_hook: Callable[[SimPeer, str], str | None] | None = None  # set by the schedule
        self.zombies: list = []         # shard task attempts declared lost that have not run yet
        self.guarded = None             # the guarded kind's ledger (guarded.GuardedLedger), set by the run
        self.stopping: set[str] = set()  # peers inside a graceful stop (no fault is injected into one)
        self.faults_on = True           # false once the run's faults have ended (the run settles)
        self.stops: list[str] = []      # batches that failed with an error other than Redis being away
        self.erased_failures: set[str] = set()  # uplink positions whose failure record a failover erased
        self.zk = ZkModel(self.clock.now, graph.cluster.session_timeout)
        self.zk_root = ZkPaths(graph.name).root
        self.turns = Turns(self.clock.now, self.wait)  # the peers' threads take turns on this clock
        self.net = EscalationNet()
        self.peers = {n: SimPeer(self, n) for n in ("a", "b")}
        self.faults: list[Fault] = []
        self._say = say
        self._waits = 0
        self._dirs = itertools.count(1)
        self._seq = 0

    def say(self, text: str) -> None:
        self._say(f"{self.clock.now() - START_TIME:9.3f} {text}")

    # -- time -------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        self.clock.advance(max(0.0, seconds))
        self.heal_due()
        self.zk.expire_due()

    def wait(self, seconds: float) -> None:
        """A store's pause between retries: time passes (and faults may heal) for everyone."""
        self._waits += 1
        if self._waits > MAX_WAITS_PER_STEP:
            raise SimulationStuck(f"a call waited {MAX_WAITS_PER_STEP} times in one step")
        self.advance(max(seconds, 0.001))

    def hold(self, sim: SimPeer, seconds: float) -> None:
        """A held batch's wait: time passes up to the next fault's end (at most 0.5 s), which
        is when what it waits for (a ZooKeeper connection) can change. Meanwhile the peer's
        ZooKeeper threads run, as in the real process: they notice the connection and a
        lost session (which demotes it)."""
        ends = [f.until for f in self.faults]
        step = min([0.5] + [max(0.0, t - self.clock.now()) for t in ends])
        self.wait(max(seconds, step))
        self.zookeeper_acts(sim)

    # -- ZooKeeper, as each peer sees it -------------------------------------
    def epoch(self) -> tuple[int, str | None]:
        """The flow's epoch in ZooKeeper and the peer that wrote it."""
        return self.zk.epoch(self.zk_root)

    def leader(self) -> str | None:
        return self.zk.leader(self.zk_root)

    def leadership_problems(self) -> list[str]:
        """What ``cluster/leadership.py`` promises of a master, checked on every peer whose
        ZooKeeper side has caught up (its client noticed all there is, connected, none of its
        threads can run): one that holds the role holds the election lock in its own session,
        at the epoch it wrote to the epoch znode. (A peer that has not noticed yet may still
        act as master: fencing is what must refuse it.)"""
        problems = []
        for sim in self.peers.values():
            lead = sim.member.leadership if sim.member is not None else None
            if lead is None or not lead.is_master or sim.zk is None or not sim.running():
                continue
            if not sim.zk.connected or sim.zk.behind() or sim.threads.pending():
                continue
            queue = self.zk.contenders(self.zk_root)
            epoch, writer = self.epoch()
            if not queue or queue[0] != (sim.peer_id, sim.zk.session.sid):
                problems.append(f"{sim.peer_id} is master but does not hold the election lock in its session "
                                f"(queue: {', '.join(p for p, _ in queue) or 'empty'})")
            elif (lead.epoch, sim.peer_id) != (epoch, writer):
                problems.append(f"{sim.peer_id} is master at epoch {lead.epoch}, but the epoch znode is at "
                                f"{epoch}, written by {writer}")
        return problems

    def zookeeper_pending(self, sim: SimPeer) -> bool:
        """Whether the peer's ZooKeeper side has something to do: notice its connection or
        session, or run a thread of its own (a watch, its election, its member keeper)."""
        return sim.zk is not None and sim.running() and (sim.zk.behind() or sim.threads.pending())

    def zookeeper_acts(self, sim: SimPeer) -> None:
        """The peer's ZooKeeper client notices what happened, and its threads run until they wait."""
        if sim.zk is None or not sim.running():
            return
        sim.zk.notice()
        sim.threads.run()

    def begin_step(self) -> None:
        self._waits = 0
        self.zk.expire_due()

    # -- faults -----------------------------------------------------------
    def add_fault(self, what: str, duration: float, heal: Callable[[], None]) -> None:
        self.faults.append(Fault(what, self.clock.now() + duration, heal))
        self.say(f"fault: {what} for {duration:.2f} s")

    def heal_due(self, everything: bool = False) -> None:
        now = self.clock.now()
        due = [f for f in self.faults if everything or f.until <= now]
        if not due:
            return
        self.faults = [f for f in self.faults if f not in due]
        for f in due:
            f.heal()
            self.say(f"healed: {f.what}")

    # -- the uplink -------------------------------------------------------
    def publish(self, key: str, docs: list[bytes]) -> list[str]:
        """Append to the uplink with entry IDs from the virtual clock, after the stream's last one (an
        operator's resubmit adds entries with IDs of Redis's choosing)."""
        ms = int(self.clock.now() * 1000)
        last = self.redis.xrevrange(key, count=1)
        if last:
            last_ms, last_seq = map(int, last[0][0].decode().split("-"))
            if (ms, self._seq + 1) <= (last_ms, last_seq):
                ms, self._seq = last_ms, last_seq
        out = []
        for body in docs:
            self._seq += 1
            position = f"{ms}-{self._seq}"
            self.redis.xadd(key, {"data": body}, id=position)
            out.append(position)
        if self.replica is not None:
            self.replica.wait()  # the producer publishes with WAIT: a failover never takes back what it sent
        return out

    # -- processes --------------------------------------------------------
    def start(self, sim: SimPeer, keep_disk: bool = True) -> str:
        if not keep_disk or "state_dir" not in sim.disk:
            sim.disk = {"state_dir": str(self.workdir / f"{sim.peer_id}-{next(self._dirs)}")}
        sim.gen += 1
        gen = sim.gen
        sim.alive, sim.paused_until, sim.zk_cut = True, float("-inf"), False
        sim.redis_link.fault = None
        # Read behind (a real worker's default) only where readers skip: a promotion then catches up
        # to the uplink's newest entry (promotion.py); the schedule decides when a worker reads.
        behind_ms = 3000 if self.dims.skip_processed and self.dims.read_behind else 0
        cfg = PeerConfig(sim.peer_id, "sim://redis", "sim://zookeeper", state_dir=sim.disk["state_dir"],
                         start_from="processed", trim_interval_s=self.dims.trim_interval_s,
                         worker_read_behind_ms=behind_ms)
        parts = SimParts(sim, lambda: sim.zk_connected(gen))
        # One member even for the sharded kind: its graph is the one shard simulated (sharding.py).
        # A promotion (on the election thread) waits for the batch lock while a batch holds it: a
        # lock of threads that take turns, so the batch goes on and the promotion's wait is virtual time.
        member = FlowMember(self.graph, cfg, clock=self.clock, parts=parts, monotonic=self.clock.now,
                            pause=lambda seconds: self.hold(sim, seconds), batch_lock=SimLock(self.turns))
        peer = Peer(self.graph, cfg, parts=parts, members=[member])
        sim.member, sim.stream, sim.peer = peer.member, None, peer
        try:
            peer.start()
        except Exception as exc:
            self._gone(sim)
            return f"start failed: {type(exc).__name__}: {exc}"
        sim.stream = peer.reading
        return "started" + ("" if keep_disk else " on a new state directory")

    def kill(self, sim: SimPeer) -> None:
        self._gone(sim)

    def stop(self, sim: SimPeer) -> str:
        """A graceful stop, as a SIGTERM asks for (``Peer.stop_gracefully``: a master hands its role
        over first), then the process exits."""
        peer = sim.peer
        if peer is None:
            return "not running"
        was = sim.member.role if sim.member is not None else "?"
        # Spark committed a batch that runs ahead; a stop that finds it not yet run leaves it to
        # handled_id, as a kill does.
        if sim.ahead is not None and sim.ahead.pending is not None:
            was += ", with a batch running ahead of its checkpoint"
        self.stopping.add(sim.peer_id)
        try:
            peer.stop_gracefully()
            said = f"stopped gracefully (was {was})"
        except Exception as exc:  # the process exits all the same
            said = f"graceful stop failed ({type(exc).__name__}: {exc}); the process exits"
        finally:
            self.stopping.discard(sim.peer_id)
        self._gone(sim)
        return said

    def _gone(self, sim: SimPeer) -> None:
        """The process is gone (killed, exited or failed to start): its threads end with it."""
        sim.alive = False
        if sim.threads is not None:
            sim.threads.kill()
        sim.member, sim.stream, sim.ahead, sim.peer = None, None, None, None  # a batch running ahead dies with it
        sim.threads, sim.zk = None, None
        sim.executors = []  # its executors go with it (attempts declared lost may still run)
        self.net.drop_to(sim.peer_id)

    def close(self) -> None:
        """The run is over: every thread of every process ends."""
        for peer in list(self.turns.peers):
            peer.kill()

    def batch_failed(self, sim: SimPeer, exc: BaseException) -> None:
        """A batch raised: Spark fails the query (or, for a batch that ran ahead, the peer stops),
        so the process exits. Redis being away is a fault's doing; anything else means the flow
        stops on it (every retry, catch-up and promotion would read the same entries again)."""
        from ...cluster.batch_intake import PeerStopping
        from ...runtime.store.store_errors import RedisUnavailable

        if isinstance(exc, (RedisUnavailable, PeerStopping)):
            return
        self.stops.append(f"{sim.peer_id}'s batch failed ({type(exc).__name__}: {exc}): the flow stops")
        if sim.alive:
            self.kill(sim)
            self.say(f"{sim.peer_id} exits: its batch failed ({type(exc).__name__})")

    # -- writes in flight ---------------------------------------------------
    def interleave(self, sim: SimPeer, when: str) -> None:
        """While ``sim``'s COMMIT is held in flight (``when``: "before" it reaches Redis or
        "after", its reply on the way back), let something else happen, as the seed says."""
        if self.interleave_hook is None or sim.peer_id in self.busy or self.rng.random() >= self.dims.interleave:
            return
        self.busy.add(sim.peer_id)
        try:
            did = self.interleave_hook(sim, when)
        finally:
            self.busy.discard(sim.peer_id)
        if did:
            self.interleaved += 1
            self.say(f"  while {sim.peer_id}'s COMMIT is in flight ({when}): {did}")
