"""One flow node of an active-active pair: master or worker, and the switch between them.

Every node reads the whole uplink through Spark. What it does with a batch
depends on its role:

- master: the ActionNode delivers each message to the sink and records its
  ID in the ID cache in one fenced Redis step, then escalates the processed
  messages (id, key, uplink position) to the other nodes over gRPC;
- worker: messages whose IDs are in the ID cache leave through bypass; the
  rest are baked by the claim-mode SortNode until an escalation claims them.

Promises under failure:

- Promotion (the master's session expired, or a handover): the new master
  takes a new epoch, raises the fencing epoch in Redis, rolls every unclaimed
  message back into its ActionNode and delivers it; IDs already in the ID
  cache are skipped, so a lost escalation never causes a double feed.
- A stale master (older epoch) changes nothing in Redis: its delivery is
  refused (Fenced), it stops acting as master and bakes instead.
- While ZooKeeper is SUSPENDED the master holds its batch and waits; while
  Redis is down every write waits and retries. Nothing is dropped.
- A message that cannot be decoded goes to the failure stream with its
  reason, once, whichever node sees it first.
- Timers (bake expiry, status) run on their own thread, so they fire with no
  new input; idle, that thread wakes a few times a second.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..runtime.clock import Clock, SystemClock
from ..runtime.flowfile import FlowSpec
from ..runtime.message import BadMessage, Message, decode
from ..runtime.nodes.sort import ClaimSortNode
from ..runtime.spark.source import WARMUP_POSITION
from ..runtime.store.flow_store import FlowKeys, FlowStore, Fenced
from .connect import connect_redis, connect_zookeeper
from .escalation import EscalationSender, EscalationServicer, StaleEpoch
from .grpc_server import AdminServicer, IngestServicer, create_server
from .leadership import Leadership

log = logging.getLogger("twinflow.node")

MASTER, WORKER, STARTING = "master", "worker", "starting"
DELIVER_CHUNK = 1000  # messages per fenced delivery script: keeps each script short


@dataclass
class NodeConfig:
    node_id: str
    redis_url: str
    zk_hosts: str
    listen: str = "127.0.0.1:0"
    advertise: str | None = None      # the address other nodes dial; default: the bound one
    spark_master: str = "local[1]"
    state_dir: str = ".twinflow"
    connect_deadline_s: float = 60.0
    status_interval_s: float = 0.5
    sweep_interval_s: float = 1.0


class FlowNode:
    def __init__(self, spec: FlowSpec, config: NodeConfig, clock: Clock | None = None):
        self.spec = spec
        self.cfg = config
        self.clock = clock or SystemClock()
        self.keys = FlowKeys(spec.name, spec.uplink_stream, spec.action.sink_stream)
        self.sort = ClaimSortNode(spec.sort.bake_time, spec.sort.unclaimed_outlink, spec.sort.max_pending)
        self.role = STARTING
        self.epoch = 0            # this node's epoch while master
        self.known_epoch = 0      # the newest epoch this node has seen anywhere
        self.delivered = 0
        self.skipped = 0          # already in the ID cache when the master got them
        self.failed = 0
        self.streaming = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._term_requested = threading.Event()
        self.store: FlowStore | None = None
        self.zk = None
        self.leadership: Leadership | None = None
        self.sender: EscalationSender | None = None
        self.server = None
        self.address = ""
        self.spark = None
        self.query = None

    # -- life cycle -------------------------------------------------------
    def start(self) -> None:
        """Connect (waiting up to the deadline), start Spark, serve gRPC, join the election, read."""
        cfg = self.cfg
        client = connect_redis(cfg.redis_url, cfg.connect_deadline_s)
        self.store = FlowStore(client, self.keys, cfg.node_id, id_ttl=self.spec.action.id_ttl)
        self.zk = connect_zookeeper(cfg.zk_hosts, cfg.connect_deadline_s, self.spec.session_timeout)
        self.known_epoch = self.store.current_epoch()
        # The JVM is forked before any gRPC object exists: forking while gRPC's
        # threads run broke the JVM launch (seen once in ~13 starts).
        self._start_spark()

        self.server, port = create_server(
            cfg.listen,
            escalation=EscalationServicer(self.spec.name, self.on_claims),
            ingest=IngestServicer(self.spec.name, self.store.publish),
            admin=AdminServicer(self.status, self.handover),
        )
        host = cfg.listen.rsplit(":", 1)[0]
        self.address = cfg.advertise or f"{host}:{port}"
        self.sender = EscalationSender(
            self.spec.name, cfg.node_id, lambda: self.epoch, self._escalation_targets,
            batch_max=self.spec.escalation_batch,
        )
        with self._lock:
            self.role = WORKER
        self.leadership = Leadership(self.zk, self.spec.name, cfg.node_id, self.address,
                                     self._on_promoted, self._on_demoted)
        self.leadership.start()
        threading.Thread(target=self._timer_loop, name="timers", daemon=True).start()
        self._start_stream()

    def _start_spark(self) -> None:
        from ..runtime.spark.session import build_session

        self.spark = build_session(f"twinflow-{self.spec.name}-{self.cfg.node_id}", self.cfg.spark_master)

    def _start_stream(self) -> None:
        from ..runtime.spark.stream import start_stream

        checkpoint = Path(self.cfg.state_dir) / self.spec.name / self.cfg.node_id / "checkpoint"
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        self.query = start_stream(
            self.spark,
            redis_url=self.cfg.redis_url,
            stream=self.keys.uplink,
            checkpoint_dir=str(checkpoint),
            on_batch=self.on_batch,
            batch_size=self.spec.batch_size,
            status_key=self.keys.read(self.cfg.node_id),
            query_name=f"{self.spec.name}_{self.cfg.node_id}".replace("-", "_"),
            source_options={"warmup": "1"},
        )
        log.info("%s started reading %s (gRPC %s); ready after the warm-up batch",
                 self.cfg.node_id, self.keys.uplink, self.address)

    def run_forever(self) -> int:
        """Run until stopped; SIGTERM (see request_term) hands the master role over first."""
        self.start()
        while not self._stop.is_set():
            if self._term_requested.is_set():
                if self.leadership.is_master:
                    result = self.handover(5.0)
                    log.info("SIGTERM handover: %s", result)
                break
            if self.query is not None and not self.query.isActive:
                exc = self.query.exception()
                log.error("the uplink stream stopped: %s", exc)
                self.stop()
                return 1
            self._stop.wait(0.1)
        self.stop()
        return 0

    def request_term(self) -> None:
        """Ask for a graceful stop (safe to call from a signal handler)."""
        self._term_requested.set()

    def stop(self) -> None:
        if self._stop.is_set() and self.leadership is None:
            return
        self._stop.set()
        self._wake.set()
        if self.query is not None:
            from ..runtime.spark.stream import stop_stream

            stop_stream(self.query, 10.0)
        if self.leadership is not None:
            self.leadership.stop()
            self.leadership = None
        if self.sender is not None:
            self.sender.stop()
        if self.server is not None:
            self.server.stop(1.0)
        if self.store is not None:
            self.store.close()
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        if self.spark is not None:
            self.spark.stop()

    # -- batches from the uplink ------------------------------------------
    def on_batch(self, batch_id: int, rows: list[tuple[str, bytes | None]]) -> None:
        msgs: list[Message] = []
        bad: list[tuple[str, str, bytes | None]] = []
        for position, data in rows:
            if position == WARMUP_POSITION:
                # The query's first batch has run: from now on it reads at speed.
                if not self.streaming:
                    self.streaming = True
                    log.info("%s is streaming", self.cfg.node_id)
                continue
            try:
                msgs.append(decode(position, data, self.spec.message))
            except BadMessage as exc:
                bad.append((position, exc.reason, data))
        if bad:
            self.store.record_failures(bad)
            with self._lock:
                self.failed += len(bad)
        while not self._stop.is_set():
            with self._lock:
                if self.role != MASTER:
                    self._bake(msgs)
                    return
                if self.leadership.may_write():
                    self._deliver(msgs)
                    return
            # Master but ZooKeeper is suspended: hold the batch until the
            # connection is back (keep the role) or the session is lost (bake).
            self._stop.wait(0.05)

    def _bake(self, msgs: list[Message]) -> None:
        present = self.store.processed([m.id for m in msgs])
        now = self.clock.now()
        for m, done in zip(msgs, present):
            self.sort.offer(m, now, processed=done)
        self._wake.set()

    def _deliver(self, msgs: list[Message]) -> None:
        """Deliver as master (caller holds the lock); on Fenced, stop being master."""
        for i in range(0, len(msgs), DELIVER_CHUNK):
            chunk = msgs[i:i + DELIVER_CHUNK]
            try:
                flags = self.store.deliver(self.epoch, chunk)
            except Fenced as exc:
                log.error("%s: %s; stepping down and baking instead", self.cfg.node_id, exc)
                self.known_epoch = max(self.known_epoch, exc.newest)
                self.role = WORKER
                self.leadership.step_down("fenced")
                self._bake(msgs[i:])
                return
            n = sum(flags)
            self.delivered += n
            self.skipped += len(flags) - n
            self.sender.send([(m.id, str(m.key), m.position) for m in chunk])

    # -- escalations from the master --------------------------------------
    def on_claims(self, epoch: int, claims: list[tuple[str, str, str]]) -> int:
        if epoch < self.known_epoch:
            raise StaleEpoch(f"epoch {epoch} is older than {self.known_epoch}")
        parse = self.spec.message.parse_key
        with self._lock:
            self.known_epoch = max(self.known_epoch, epoch)
            if self.role == MASTER:
                return 0  # a newer master is us: nothing of ours is baked
            return sum(len(self.sort.claim(mid, parse(key), pos)) for mid, key, pos in claims)

    def _escalation_targets(self) -> dict[str, str]:
        members = self.leadership.members() if self.leadership else {}
        members.pop(self.cfg.node_id, None)
        return members

    # -- roles ------------------------------------------------------------
    def _on_promoted(self, epoch: int) -> None:
        in_force = self.store.raise_epoch(epoch)
        if in_force > epoch:
            # Redis has seen a newer epoch than ZooKeeper just gave us (ZooKeeper
            # was reset?): our writes would all be refused. Stay a worker.
            log.error("epoch %d from ZooKeeper is older than %d in Redis; not taking the master role",
                      epoch, in_force)
            self.leadership.step_down("stale epoch")
            return
        with self._lock:
            self.epoch = epoch
            self.known_epoch = max(self.known_epoch, epoch)
            self.role = MASTER
            rolled = self.sort.rollback()
            if rolled:
                self._deliver(rolled)
        log.info("%s is master at epoch %d; rolled back %d unclaimed messages",
                 self.cfg.node_id, epoch, len(rolled))

    def _on_demoted(self, reason: str) -> None:
        with self._lock:
            self.role = WORKER
        if reason == "handover":
            # The next master must see every claim before it rolls back.
            self.sender.flush(2.0)

    def handover(self, timeout_s: float) -> dict:
        if self.leadership is None:
            return {"ok": False, "reason": "node is not running"}
        return self.leadership.handover(timeout_s)

    # -- timers -----------------------------------------------------------
    def _timer_loop(self) -> None:
        next_status = next_sweep = 0.0
        while not self._stop.is_set():
            now = self.clock.now()
            with self._lock:
                unclaimed = self.sort.tick(now) if self.role != MASTER else []
                deadline = self.sort.next_deadline()
            try:
                if unclaimed:
                    log.warning("%d messages fully baked without a claim (first: %s)",
                                len(unclaimed), unclaimed[0].id)
                    self.store.surface_unclaimed(unclaimed, self.spec.sort.unclaimed_outlink)
                mono = time.monotonic()
                if mono >= next_sweep:
                    next_sweep = mono + self.cfg.sweep_interval_s
                    self._sweep_overdue()
                if mono >= next_status:
                    next_status = mono + self.cfg.status_interval_s
                    self.known_epoch = max(self.known_epoch, self.store.current_epoch())
                    self.store.write_status(self.status(), ttl_s=max(5, int(4 * self.cfg.status_interval_s)))
            except Exception:  # a timer must keep firing; the store already retries Redis errors
                if self._stop.is_set():
                    return
                log.exception("timer loop")
            wait = min(self.cfg.status_interval_s, self.cfg.sweep_interval_s)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - self.clock.now()))
            self._wake.wait(wait)
            self._wake.clear()

    def _sweep_overdue(self) -> None:
        """Forget surfaced messages whose IDs reached the ID cache (their claim was lost)."""
        with self._lock:
            ids = self.sort.overdue_ids()
        if not ids:
            return
        present = self.store.processed(ids)
        with self._lock:
            self.sort.forget([i for i, p in zip(ids, present) if p])

    def status(self) -> dict:
        with self._lock:
            out = {
                "flow": self.spec.name,
                "node_id": self.cfg.node_id,
                "role": self.role,
                "epoch": self.epoch if self.role == MASTER else self.known_epoch,
                "baked": self.sort.pending,
                "claimed": self.sort.claimed,
                "rolled_back": self.sort.rolled_back,
                "delivered": self.delivered,
                "failed": self.failed,
                "unclaimed": self.sort.unclaimed,
                "grpc_address": self.address,
            }
        out["streaming"] = int(self.streaming)
        out["pid"] = os.getpid()
        try:
            out["uplink_lag"] = self.store.uplink_lag(self.cfg.node_id) if self.store else 0
        except Exception:  # status must answer even when Redis does not
            out["uplink_lag"] = -1
        return out
