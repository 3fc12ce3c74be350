"""Drills between hosts (``twinflow drill NAME --hosts``): a fault on one host of a lab
(:mod:`twinflow_dev.lab`: servers, peers and a client, each in a network namespace of its
own with its own address) while the client host publishes, then the one checker.

Each drill runs on a full lab (Redis behind three Sentinels, a three-server ZooKeeper
ensemble, a Spark standalone cluster of two workers, two peers run through the deployment
guide's systemd unit, mutual TLS and tokens on every link; made for the drill's first run and
kept for its next, see :class:`HostDrillRunner`), publishes ``messages`` orders and
payments of the chained flow from the client host at ``rate`` per second, injects the drill's
fault, waits until every acknowledged message left the flow, and counts what the local
drills count (:func:`.drills.verdict`: lost, duplicated, out of order, stale writes, RTO),
with the same JSON keys. The drills:

- ``host-partition``: the master's host loses ZooKeeper and the other peer (nftables drops
  in its namespace: packets lost, connections left open) but still reaches Redis; the other
  peer takes over; healed, the old master comes back as worker. Then the new master's host
  loses Redis, keeps ZooKeeper: its write lease runs out, it steps down, the first peer takes
  over again; healed.
- ``asymmetric-partition``: what the master sends to the worker is dropped, what it receives
  arrives, for longer than the worker's bake time; then, still cut, the master's host dies
  (the worker holds messages whose claims never came: it must roll them back, not lose them).
- ``host-crash``: every process of the master's host SIGKILLed at once; the host comes back
  (its peer started again through the unit) and rejoins as worker.
- ``spark-worker-crash``: the flow in two uplink shards, its batches on the Spark cluster's
  executors; the worker host running the master's executor dies; Spark runs the batches on
  an executor on the other worker; the host comes back.
- ``rolling-restart``: each peer restarted through its unit's ``ExecStop`` (SIGTERM: a
  master hands over) and ``ExecStart``, the worker first, under load. Also measured:
  ``max_gap_s``, the longest time without a sink write from the first restart to the end;
  target 1 s.
- ``clock-skew``: the worker's host restarted under libfaketime with its wall clock 5 s
  ahead (odd seeds) or behind (even seeds; its JVM's clock left true, see
  ``lab_faults.true_clock_java``), then the master's host dies and the skewed peer
  fires the time-outs the old master left. Also measured: ``timeout_error_ms`` (p50 and
  max of how late, negative: early, each lone order's time-out was written after its due
  time, the uplink entry's Redis time plus the join's time-out) for the time-outs fired
  after the failover.

A drill whose master dies or is cut off passes with ``rto_s`` under 3 s; rolling-restart
with ``max_gap_s`` at most 1 s. Needs root (network namespaces); under failure the lab is
taken down in any case, and a drill that cannot reach its check raises with the lab's logs.
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from twinflow_dev.lab import Lab, LabError
from twinflow_dev.lab_faults import HostFirewall, executor_hosts, fake_clock_env, true_clock_java
from twinflow_dev.lab_hosts import PEERS

from ..runtime.waiting import wait_for
from ..testing import checker
from ..testing.checker import in_time_order, recovery_s, wait_judged
from ..testing.messages import order_or_payment
from .drill_record import FaultRecord
from .drills import verdict
from .report import timeline

MAX_GAP_TARGET_S = 1.0
SKEW_S = 5.0
JOIN_TIMEOUT_MS = 10_000  # the chained flow's join time-out (examples/cluster-chained.yaml)
ROLE_DEADLINE_S = 30.0


@dataclass
class HostDrill(FaultRecord):
    """What a host drill sees: the lab, the roles at the start, the seed, the producer's count."""

    lab: Lab
    master: str
    worker: str
    seed: int
    sent: Callable[[], int]
    total: int
    rate: float
    faults: list[float] = field(default_factory=list)
    windows: list[list] = field(default_factory=list)
    say: Callable[[str], None] = lambda text: None
    figures: dict = field(default_factory=dict)  # what a drill measures beside the checker's counts

    def address(self, host: str) -> str:
        return self.lab.state.host(host).address

    def role(self, host: str) -> str | None:
        return self.lab.peer_statuses().get(host, {}).get("role")

    def wait_role(self, host: str, role: str, deadline_s: float = ROLE_DEADLINE_S) -> None:
        """Wait until ``host``'s status in Redis says ``role``."""
        if not wait_for(lambda: self.role(host) == role, deadline_s, 0.1):
            raise RuntimeError(f"{host} was not {role} {deadline_s:.0f} s on (statuses "
                               f"{ {h: r.get('role') for h, r in self.lab.peer_statuses().items()} }):\n"
                               + self.lab.logs(lines=30))

    def crash(self, host: str) -> None:
        """Every process of ``host`` killed at once (a fault: its recovery counts)."""
        self.fault(f"every process of {host} killed")
        self.lab.kill_host(host)

    def come_back(self, host: str) -> None:
        """A peer host that died starts again: its peer through the unit, back as worker."""
        self.lab.start_peer(host)
        self.lab.wait_streaming(host)
        self.wait_role(host, "worker")
        self.say(f"  {host} is back, as worker")


# -- the drills ------------------------------------------------------------------------------------
def host_partition(d: HostDrill) -> None:
    a, b = d.master, d.worker
    zk = [d.address(h) for h in d.lab.plan.zk_names]
    d.wait_sent(0.25)
    partition(d, a, zk + [d.address(b)], f"ZooKeeper and {b}; Redis reachable", heir=b)
    d.wait_sent(0.6)
    partition(d, b, [d.address("redis")], "Redis; ZooKeeper reachable", heir=a)


def partition(d: HostDrill, host: str, addresses: list[str], what: str, heir: str) -> None:
    """``host`` drops every packet to and from ``addresses`` until ``heir`` is master; then
    healed, until ``host`` is worker again."""
    cut = HostFirewall(d.lab, host)
    d.fault(f"{host} cut from {what} (packets dropped)", lasts=True)
    try:
        cut.drop(addresses)
        d.wait_role(heir, "master")
    finally:
        cut.heal()
    d.healed()
    d.wait_role(host, "worker")
    d.say(f"  healed: {host} is worker")


def asymmetric_partition(d: HostDrill) -> None:
    a, b = d.master, d.worker
    d.wait_sent(0.2)
    cut = HostFirewall(d.lab, a)
    d.window(f"{a}'s packets to {b} dropped (what {b} sends arrives)")
    cut.drop([d.address(b)], direction="out")
    # Longer than the worker's bake time (5 s): what it holds unclaimed is released by the
    # processed mark, or rolled back when it takes over.
    d.wait_sent(min(0.8, 0.2 + 7.0 * d.rate / d.total))
    d.crash(a)
    cut.heal()
    d.healed()
    d.wait_role(b, "master")
    d.come_back(a)


def host_crash(d: HostDrill) -> None:
    d.wait_sent(0.4)
    d.crash(d.master)
    d.wait_role(d.worker, "master")
    d.come_back(d.master)


def spark_worker_crash(d: HostDrill) -> None:
    app = f"twinflow-{d.lab.plan.flow}-{d.master}"
    d.wait_sent(0.3)
    hosts = executor_hosts(d.lab, app)
    if not hosts:
        raise LabError(f"no executor of {app} on sw1 or sw2")
    host = hosts[0]
    d.fault(f"{host} (a Spark worker running {d.master}'s executor) died", lasts=True)
    d.lab.kill_host(host)
    if not wait_for(lambda: [h for h in executor_hosts(d.lab, app) if h != host], 60, 0.2):
        raise LabError(f"{app} got no executor on another worker within 60 s:\n" + d.lab.logs(lines=30))
    d.say(f"  {app} runs on {executor_hosts(d.lab, app)}")
    d.wait_sent(0.7)
    d.lab.start_server(host, "spark-worker")
    d.healed()
    d.say(f"  {host} is back")


def rolling_restart(d: HostDrill) -> None:
    d.wait_sent(0.1)
    statuses = {}
    for host in (d.worker, d.master):
        what = f"{host} restarted through its unit (ExecStop, then ExecStart)"
        if host == d.master:  # its handover is the recovery that counts
            d.fault(what, lasts=True)
        else:  # the master writes on: no recovery to time
            d.window(what)
        statuses[host] = d.lab.stop_peer(host)
        d.lab.start_peer(host)
        d.lab.wait_streaming(host)
        d.healed()
        d.say(f"  {host} stopped with status {statuses[host]} and streams again")
    d.figures["stop_status"] = statuses


def clock_skew_setup(d: HostDrill) -> None:
    """Before the load: the worker restarted with its wall clock off by +-5 s."""
    offset = SKEW_S if d.seed % 2 else -SKEW_S
    d.figures["skew_s"] = offset
    d.lab.stop_peer(d.worker)
    jvm = true_clock_java(d.lab.plan.host_dir(d.worker) / "true-clock-java")
    d.lab.start_peer(d.worker, {**fake_clock_env(offset), **jvm})
    d.lab.wait_streaming(d.worker)
    d.wait_role(d.worker, "worker")
    seen = d.lab.peer_statuses()[d.worker].get("clock_offset_s")
    d.say(f"  {d.worker} runs with its clock {offset:+g} s off (its status: clock offset {seen} s)")


def clock_skew(d: HostDrill) -> None:
    d.wait_sent(0.5)
    d.crash(d.master)
    d.wait_role(d.worker, "master")
    d.come_back(d.master)


@dataclass(frozen=True)
class HostDrillSpec:
    run: Callable[[HostDrill], None]
    rate: float = 1000.0               # default messages per second
    shards: int = 1
    kills_master: bool = True          # its RTO is held to the target
    setup: Callable[[HostDrill], None] | None = None
    figures: Callable[[HostDrill, dict], None] | None = None  # measures the run's outputs (may fail it)


HOST_DRILLS: dict[str, HostDrillSpec] = {
    "host-crash": HostDrillSpec(host_crash, rate=500.0),
    "host-partition": HostDrillSpec(host_partition, rate=250.0),
    "asymmetric-partition": HostDrillSpec(asymmetric_partition, rate=500.0),
    "spark-worker-crash": HostDrillSpec(spark_worker_crash, rate=500.0, shards=2, kills_master=False),
    "clock-skew": HostDrillSpec(clock_skew, rate=500.0, setup=clock_skew_setup),
    "rolling-restart": HostDrillSpec(rolling_restart, rate=100.0, kills_master=False),
}


# -- running them ----------------------------------------------------------------------------------
class HostDrillRunner:
    """Runs drills between hosts, the runs of one drill on one lab: made for its first run, taken
    down when another drill begins or at :meth:`close` (a full lab takes over a minute to come
    up on two cores). Each run publishes message IDs of its own (the next ``messages`` of
    :func:`~twinflow.testing.messages.order_or_payment`) and is judged on what left the flow
    of those alone, from a lab where both peers stream and one is master. A run that cannot
    reach its check takes its lab down: the next run makes a fresh one."""

    drills: dict[str, HostDrillSpec] = HOST_DRILLS

    def __init__(self, messages: int = 10_000, rate: float | None = None,
                 directory: str | Path = ".twinflow/drill-lab", prefix: str = "tfdr-", settle_s: float = 90.0,
                 say: Callable[[str], None] = lambda text: None):
        self.messages, self.rate, self.settle_s, self.say = messages, rate, settle_s, say
        self.directory, self.prefix = directory, prefix
        self.lab: Lab | None = None
        self.drill: str | None = None
        self.published = 0  # messages the lab's runs have published: the next run's first

    def close(self) -> None:
        if self.lab is not None:
            self.lab.down()
        self.lab, self.drill, self.published = None, None, 0

    def _lab_for(self, name: str) -> Lab:
        if self.drill != name:
            self.close()
            spec = self.drills[name]
            # An unsharded flow's batches in the peer (Spark's local mode), as the deployment guide
            # advises; a sharded flow's on the Spark cluster's executors.
            lab = Lab(self.directory, prefix=self.prefix, flow="drill", shards=spec.shards,
                      spark_cluster=spec.shards > 1)
            lab.up(self.say)
            self.lab, self.drill = lab, name
        return self.lab

    def run(self, name: str, seed: int) -> dict:
        """Run drill ``name`` once and check it (see module)."""
        if name not in self.drills:
            raise KeyError(f"unknown host drill {name!r} (known: {', '.join(self.drills)})")
        try:
            result = self._run(self._lab_for(name), name, seed)
        except BaseException:
            if self.lab is not None:
                self._keep_logs(name, seed)
            self.close()
            raise
        if not result["passed"]:
            result["kept_logs"] = str(self._keep_logs(name, seed))
        return result

    def _keep_logs(self, name: str, seed: int) -> Path:
        """Copy the lab's logs (every process's, ``hosts/*/*/*.log``) to ``failed-<drill>-<seed>/``
        beside it: the next lab made in the directory starts by removing them."""
        kept = self.lab.directory / f"failed-{name}-{seed}"
        for log in self.lab.directory.glob("hosts/*/*/*.log"):
            target = kept / log.relative_to(self.lab.directory / "hosts")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, target)
        return kept

    def _run(self, lab: Lab, name: str, seed: int) -> dict:
        spec, messages = self.drills[name], self.messages
        rate = self.rate or spec.rate
        if not wait_for(lab.ready, 120, 0.2):
            raise LabError("the lab has no master with both peers streaming:\n" + lab.logs(lines=30))
        first, self.published = self.published, self.published + messages
        ids = {order_or_payment(i)["id"] for i in range(first, first + messages)}
        acked = lab.directory / f"acked-{first}.txt"
        acked.unlink(missing_ok=True)  # left by an earlier lab in the same directory
        master = lab.master() or lab.shard_masters()[0]  # of a sharded flow, shard 0's
        peers = lab.peer_ids() if hasattr(lab, "peer_ids") else PEERS
        d = HostDrill(lab, master, next(p for p in peers if p != master), seed, lambda: _count(acked), messages,
                      rate, say=self.say)
        d.figures["first"] = first
        if spec.setup is not None:
            spec.setup(d)
        publisher = lab.publisher(messages, rate, acked, first)
        spec.run(d)
        self.published += d.figures.get("more", 0)  # messages the drill published beside the run's
        status = lab.wait_exit(publisher, messages / rate + 180)
        if status != 0:
            raise LabError(f"the client host's publisher ended with {status}:\n" + lab.logs([publisher], 20))
        sent = acked.read_text().split()
        outputs = lambda: this_run(lab.outputs(), ids)  # noqa: E731
        out = wait_judged(outputs, sent, self.settle_s)
        result = verdict(checker.check_shards([this_run(o, ids) for o in lab.shard_outputs()], sent, d.faults),
                         spec.kills_master)
        writes = in_time_order(out)
        rtos = (recovery_s(writes, at) for at in d.faults)
        result["rto_each_s"] = [None if r is None else round(r, 3) for r in rtos]
        if name == "rolling-restart":
            gap = max_gap_s(writes, d.windows[0][0])
            d.figures["max_gap_s"] = round(gap, 3)
            result["passed"] = result["passed"] and gap <= MAX_GAP_TARGET_S
        if name == "clock-skew":
            d.figures.update(timeout_errors(lab, out, d.faults[-1]))
        if spec.figures is not None:
            spec.figures(d, out)
        result.update(drill=name, hosts=True, seed=seed, messages=messages, rate=rate, **d.figures)
        result["timeline"] = timeline(out, d.windows)
        result["rerun"] = f"twinflow drill {name} --hosts --seed {seed} --messages {messages} --rate {rate:g}"
        if not result["passed"]:
            result["logs"] = lab.logs(lines=20)
        return result


def this_run(outputs: dict, ids: set[str]) -> dict:
    """The entries of ``outputs`` with a member among ``ids`` (a run's own messages)."""
    return {k: [e for e in v if any(m in ids for m in e.id.split("+"))] for k, v in outputs.items()}


def _count(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
    except FileNotFoundError:
        return 0


def max_gap_s(writes: list, since: float) -> float:
    """The longest time between two consecutive writes from ``since`` (epoch s) on."""
    times = [w.written_ms / 1000 for w in writes]
    before = [t for t in times if t <= since]
    after = [t for t in times if t > since]
    edge = before[-1:] + after
    return max((b - a for a, b in zip(edge, edge[1:])), default=0.0)


def timeout_errors(lab: Lab, outputs: dict, failover_at: float, timeout_ms: int = JOIN_TIMEOUT_MS) -> dict:
    """How late (ms; negative: early) each time-out written after ``failover_at`` came, against
    its due time: the order's uplink entry time (Redis's clock) plus the join's time-out."""
    arrived = lab.uplink_times()
    errors = sorted(e.written_ms - (arrived[e.id] + timeout_ms) for e in outputs.get("match.expired", [])
                    if e.written_ms / 1000 > failover_at and e.id in arrived)
    if not errors:
        return {"timeouts_after_failover": 0}
    return {"timeouts_after_failover": len(errors), "timeout_error_ms_p50": round(statistics.median(errors)),
            "timeout_error_ms_min": errors[0], "timeout_error_ms_max": errors[-1]}
