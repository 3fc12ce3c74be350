"""``twinflow bench flow-vs-passthrough``: the two-peer cluster next to its floor, two bare Spark
readers of the same uplink, interleaved in one run.

Both run on the same machine at once, against one local Redis (and ZooKeeper for the pair):

- two bare readers (the floor of an active-active pair, which reads every uplink entry twice
  on the same machine): twinflow's own Spark session and Redis-stream source with nothing of
  the flow, each in a child process of its own (its own driver and JVM), each copying one
  uplink to a sink of its own with one pipeline per batch. The slower copy's rate counts.
- the pair: two ``twinflow run`` peers on the chained flow (``examples/cluster-chained.yaml``:
  history -> AND join of an order and its payment -> action, with the claim pair), the
  messages of ``twinflow demo`` (one order in ten alone, one in ten sent twice), each peer
  writing where its master batches spend their time to a batch log (``--batch-log``,
  ``cluster/batch_phases.py``).

Both are started once and stay up; then ``rounds`` rounds (default 5) run them in turns, the
order flipped every round (bare, pair; pair, bare; ...), so that the machine's drift over the
run falls on both alike. Per round and side: a burst of N messages published as fast as Redis
pipelines go, messages per second from the first publish until every one is done (both sinks
hold all N; the pair's processed mark passes the last); CPU per message over the burst, of
every process of the measured trees (a peer or a reader: its Python, its JVM, the JVM's Python
workers) and of the servers the side runs on (Redis; ZooKeeper for the pair), the publisher
not counted; then latency at a steady rate (2,000 msg/s for 15 s by default) on a side with
nothing left to do (the pair once it has settled: both readers past the last message, the
join's groups closed by their time-outs): a sink entry's Redis time minus the uplink entry's
(for a joined pair, its later member's), p50 and p99.

Each figure, and each round's ratio of the pair's to the floor's, is reported as the median
and the spread of the rounds (``twinflow_dev.bench_stats``): one burst on 2 shared cores
swings by 15-30%, and a change smaller than a figure's spread is noise. The master's batch
log gives the breakdown per batch, p50 and p99 of each phase, over the bursts and over the
steady load.

Under failure: a side that does not finish within its deadline raises BenchError with what
it was waiting for; every process it started is stopped by PID (the readers by closing their
stdin, then a kill; the Cluster and LocalServices own the rest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import redis

from twinflow.cluster.batch_phases import BATCH_PHASES, PHASES, read_batch_log
from twinflow.runtime.flowgraph import FlowGraph
from twinflow.runtime.nodes.history import HistoryNode
from twinflow.runtime.nodes.sort import SortNode
from twinflow.runtime.positions import position_order
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.waiting import wait_for
from .bench_stats import ServerCpu, median, quantile, ratio, summarise
from .bench_stats import us_per_message as per_message_us
from twinflow.testing.local_cluster import LocalCluster
from twinflow.testing.messages import CHAINED, order_or_payment
from twinflow.testing.proc_stats import cpu_ticks
from twinflow.testing.producers import UplinkPublisher
from twinflow.testing.services import LocalServices

# The targets for the pair, checked on the medians of the rounds.
TARGETS = {"ratio_two": (">=", 0.85), "p50_ratio": ("<=", 1.1), "pair_p99_ms": ("<=", 100.0),
           "cpu_ratio": ("<=", 1.25)}


class BenchError(RuntimeError):
    """A side of the bench did not finish in time; the message says what it waited for."""


@dataclass
class Load:
    messages: int = 50_000
    rate: float = 2000.0
    seconds: float = 15.0
    rounds: int = 5        # bursts and steady loads per side, interleaved
    batch_size: int = 10_000  # a bare reader's largest batch (the pair's flow file sets its own)

    def __post_init__(self) -> None:
        if self.messages < 1 or self.rounds < 1:
            raise ValueError(f"a bench needs at least one message and one round (got {self.messages}, {self.rounds})")


def percentile_ms(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of seconds, in milliseconds (nearest rank)."""
    return None if not values else round(quantile(values, q) * 1000, 1)


def entry_ms(position: str) -> int:
    """The Redis time (ms) in a stream entry ID."""
    return position_order(position)[0]


def passthrough_doc(seq: int) -> dict:
    return {"id": f"p{seq}", "seq": seq}


# -- the floor: two bare readers ---------------------------------------------
def _start_copy(spark, client: redis.Redis, redis_url: str, uplink: str, sink: str, batch_size: int,
                checkpoint_dir: str):
    """A bare passthrough query (twinflow's session and source, nothing of the flow) copying
    every entry of ``uplink`` to ``sink`` with one pipeline per batch; returns it once its
    warm-up batch has run."""
    from twinflow.runtime.positions import WARMUP_POSITION
    from twinflow.runtime.spark.stream import start_stream, stop_stream

    warm = threading.Event()

    def copy(batch_id: int, rows: list) -> None:
        pipe = client.pipeline(transaction=False)
        for position, data, _ in rows:
            if position == WARMUP_POSITION:
                warm.set()
                continue
            pipe.xadd(sink, {"position": position, "data": data or b""})
        pipe.execute()

    query = start_stream(spark, redis_url=redis_url, stream=uplink, checkpoint_dir=checkpoint_dir,
                         on_batch=copy, batch_size=batch_size, source_options={"warmup": "1"})
    if not warm.wait(120):
        stop_stream(query, 30)
        raise BenchError(f"the passthrough query to {sink} did not run its warm-up batch in 120 s")
    return query


def _reader_child(redis_url: str, uplink: str, sink: str, batch_size: int, workdir: str) -> dict:
    """Run in a child of :class:`BareReaders`: one bare reader copying ``uplink`` to ``sink``;
    prints "ready" once its query is warm and copies until its stdin closes."""
    from twinflow.runtime.spark.session import build_session
    from twinflow.runtime.spark.stream import stop_stream

    spark = build_session("twinflow-bench-reader")
    client = redis.Redis.from_url(redis_url)
    query = _start_copy(spark, client, redis_url, uplink, sink, batch_size, f"{workdir}/{sink.replace(':', '-')}")
    try:
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes it: the bench is over
    finally:
        stop_stream(query, 30)
        spark.stop()
    return {"sink": sink}


class BareReaders:
    """Two bare readers of one uplink, each in a child process of its own (its own driver and
    JVM), each copying it to a sink of its own: the floor of an active-active pair. Started
    once, kept up between bursts; :meth:`stop` closes their stdin, then kills what is left."""

    def __init__(self, redis_url: str, batch_size: int, workdir: str, tag: str = "two"):
        self.client = redis.Redis.from_url(redis_url)
        self.uplink = f"pt:{tag}:uplink"
        self.sinks = (f"pt:{tag}:sink1", f"pt:{tag}:sink2")
        self.redis_url, self.batch_size, self.workdir = redis_url, batch_size, workdir
        self.children: list[subprocess.Popen] = []
        self.pub = UplinkPublisher(self.client, self.uplink, passthrough_doc)

    def start(self) -> "BareReaders":
        try:
            os.makedirs(self.workdir, exist_ok=True)
            for sink in self.sinks:
                args = json.dumps({"reader": True, "redis_url": self.redis_url, "uplink": self.uplink,
                                   "sink": sink, "batch_size": self.batch_size, "workdir": self.workdir})
                with open(self._log(sink), "w") as err:
                    self.children.append(subprocess.Popen([sys.executable, "-m", __name__, args],
                                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                                          text=True))
            for sink, child in zip(self.sinks, self.children):  # "ready" once warm; one that fails ends without it
                if not any(line.strip() == "ready" for line in iter(child.stdout.readline, "")):
                    with open(self._log(sink)) as err:
                        tail = err.read()[-3000:]
                    raise BenchError(f"a bare reader ended before it was ready (exit {child.wait(30)}):\n{tail}")
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def _log(self, sink: str) -> str:
        return os.path.join(self.workdir, f"{sink.replace(':', '-')}.log")

    def burst(self, n: int) -> dict:
        """Publish ``n`` and wait until both sinks hold them: the slower's and the faster's rate,
        and the readers' CPU ticks (each until its sink was full)."""
        before = [self.client.xlen(s) for s in self.sinks]
        ticks = [cpu_ticks(pid, reaped=True) for pid in self.pids]
        t0 = time.monotonic()
        self.pub.publish(n)
        took, used = {}, {}
        deadline = t0 + 600
        while len(took) < len(self.sinks) and time.monotonic() < deadline:
            for i, sink in enumerate(self.sinks):
                if i not in took and self.client.xlen(sink) >= before[i] + n:
                    took[i] = time.monotonic() - t0
                    used[i] = cpu_ticks(self.pids[i], reaped=True) - ticks[i]
            time.sleep(0.01)  # a poll's pace; the deadline bounds the loop
        if len(took) < len(self.sinks):
            raise BenchError(f"two bare readers: {len(took)} of 2 sinks full in 600 s")
        return {"msgs_per_s": n / max(took.values()), "faster_msgs_per_s": n / min(took.values()),
                "ticks": sum(used.values())}

    def steady(self, rate: float, seconds: float) -> list[float]:
        """Latencies (s) of a steady load, from the first reader's sink."""
        since = self.client.time()
        since_ms = since[0] * 1000 + since[1] // 1000
        before = [self.client.xlen(s) for s in self.sinks]
        sent = self.pub.seq
        self.pub.steady(rate, seconds)
        n = self.pub.seq - sent
        if not wait_for(lambda: all(self.client.xlen(s) >= b + n for s, b in zip(self.sinks, before)), 300, 0.01):
            raise BenchError("two bare readers: the steady load was not copied in 300 s")
        return [(entry_ms(sink_id.decode()) - entry_ms(fields[b"position"].decode())) / 1000
                for sink_id, fields in self.client.xrange(self.sinks[0], min=f"{since_ms}-0")]

    def stop(self) -> None:
        for child in self.children:
            try:
                child.stdin.close()
            except OSError:
                pass
        for child in self.children:
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)


def two_passthroughs(redis_url: str, load: Load) -> dict:
    """The floor alone: two bare readers, ``load.rounds`` bursts; the median rate of the slower,
    and the readers' CPU per message (Redis not counted)."""
    with tempfile.TemporaryDirectory(prefix="twinflow-two-readers-") as workdir:
        readers = BareReaders(redis_url, load.batch_size, workdir).start()
        try:
            bursts = [readers.burst(load.messages) for _ in range(load.rounds)]
        finally:
            readers.stop()
    return {"msgs_per_s": round(median(b["msgs_per_s"] for b in bursts)),
            "faster_msgs_per_s": round(median(b["faster_msgs_per_s"] for b in bursts)),
            "burst_msgs_per_s": [round(b["msgs_per_s"]) for b in bursts],
            "cpu_us_per_msg": per_message_us(sum(b["ticks"] for b in bursts), load.messages * load.rounds),
            "batch_size": load.batch_size}


# -- the pair -----------------------------------------------------------------
class Pair:
    """The two-peer cluster on the chained flow (``text``: another flow file of orders and
    payments; ``peer_args``: more ``twinflow run`` arguments for both peers), each peer writing
    its batch log in ``workdir``. Started once, kept up between bursts."""

    def __init__(self, services: LocalServices, text: str | None = None, peer_args: tuple[str, ...] = ()):
        self.workdir = tempfile.mkdtemp(prefix="twinflow-bench-flow-")
        self.logs = os.path.join(self.workdir, "batches-{peer}.jsonl")
        self.cluster = LocalCluster(self.workdir, flow="benchflow", services=services,
                                    text=text or CHAINED.read_text(),
                                    peer_args=(*peer_args, "--batch-log", self.logs)).start(peers=False)
        self.store = FlowStore(self.cluster.redis, FlowKeys("benchflow"), "bench")
        self.pub = UplinkPublisher(self.cluster.redis, self.store.keys.uplink, order_or_payment)

    def start(self) -> "Pair":
        try:
            self.cluster.start_peers()
            self.cluster.wait_ready()
        except BaseException:
            self.cluster.stop()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.cluster.peers.values()]

    def _processed_past(self, position: str) -> bool:
        mark = self.store.processed_mark()
        return mark is not None and position_order(mark) >= position_order(position)

    def burst(self, n: int) -> dict:
        ticks = sum(cpu_ticks(p, reaped=True) for p in self.pids)
        t0 = time.monotonic()
        self.pub.publish(n)
        if not wait_for(lambda: self._processed_past(self.pub.last), 900, 0.01):
            raise BenchError(f"pair: a burst was not processed in 900 s\n{self.cluster.logs()}")
        took = time.monotonic() - t0
        return {"msgs_per_s": n / took, "ticks": sum(cpu_ticks(p, reaped=True) for p in self.pids) - ticks}

    def settle(self) -> None:
        """Wait until both readers are past the last message and the join's groups are closed."""
        c = self.cluster
        if not wait_for(lambda: settled(c.redis, self.store.keys, c.graph, list(c.peers), self.pub.last), 120, 0.05):
            raise BenchError(f"pair: it did not settle in 120 s\n{c.logs()}")

    def steady(self, rate: float, seconds: float) -> list[float]:
        """Latencies (s) of a steady load: a sink entry's time minus its (later) member's."""
        c = self.cluster
        since = c.redis.time()
        since_ms = since[0] * 1000 + since[1] // 1000
        self.pub.steady(rate, seconds)
        if not wait_for(lambda: self._processed_past(self.pub.last), 300, 0.01):
            raise BenchError(f"pair: the steady load was not processed in 300 s\n{c.logs()}")
        lat = []
        for sink_id, fields in c.redis.xrange(c.sink_key, min=f"{since_ms}-0"):
            # A joined pair leaves as one message whose ID joins its members' with "+".
            members = json.loads(fields[b"ids"]) if b"ids" in fields else fields[b"id"].decode().split("+")
            written = [self.pub.written_ms[m] for m in members if m in self.pub.written_ms]
            if written:
                lat.append((entry_ms(sink_id.decode()) - max(written)) / 1000)
        return lat

    def batches(self, since: float, until: float) -> list[dict]:
        """Every peer's master batches logged between the wall times ``since`` and ``until``, their
        waits cut to what fell after ``since`` (:func:`within`)."""
        out = []
        for peer in self.cluster.peers:
            out += [within(b, since) for b in read_batch_log(self.logs.replace("{peer}", peer))
                    if since <= b["at"] <= until]
        return out

    def stop(self) -> None:
        self.cluster.stop()


def flow(services: LocalServices, load: Load, text: str | None = None, peer_args: tuple[str, ...] = ()) -> dict:
    """The pair alone: ``load.rounds`` bursts, then latency once settled; medians over the bursts."""
    pair = Pair(services, text, peer_args).start()
    try:
        bursts = [pair.burst(load.messages) for _ in range(load.rounds)]
        pair.settle()
        lat = pair.steady(load.rate, load.seconds)
    finally:
        pair.stop()
    return {"msgs_per_s": round(median(b["msgs_per_s"] for b in bursts)),
            "burst_msgs_per_s": [round(b["msgs_per_s"]) for b in bursts],
            "cpu_us_per_msg": per_message_us(sum(b["ticks"] for b in bursts), load.messages * load.rounds),
            "p50_ms": percentile_ms(lat, 0.5), "p99_ms": percentile_ms(lat, 0.99), "latency_samples": len(lat)}


def settled(client: redis.Redis, keys: FlowKeys, graph: FlowGraph, peers: list[str], last: str) -> bool:
    """Whether a pair is done with what came up to ``last``: every peer's reader has read past
    it, and no node keeps state in Redis but a history (which keeps every entry for its
    retention) or the claim pair's sort: a join's open groups, an aggregate's, wait for their
    time-outs."""
    for peer in peers:
        read = client.hget(keys.read(peer), "read_id")
        if read is None or position_order(read.decode()) < position_order(last):
            return False
    return all(client.hlen(keys.state(name)) == 0 for name, node in graph.nodes.items()
               if not isinstance(node, (HistoryNode, SortNode)))


def within(batch: dict, since: float) -> dict:
    """``batch`` (a batch log line) with the phases that wait for work, ``spark`` on Spark's
    thread and ``idle`` on the batch thread, cut to what fell after the wall time ``since``: the
    first batch of a burst otherwise counts the quiet before the burst as its own."""
    batch = dict(batch)
    spark_from = batch["began"] - (batch["spark"] + batch["read"]) / 1000
    if spark_from < since:
        batch["spark"] = round(max(0.0, (batch["began"] - since) * 1000 - batch["read"]), 3)
    taken = batch["at"] - batch["took_ms"] / 1000
    if taken - batch["idle"] / 1000 < since:
        batch["idle"] = round(max(0.0, (taken - since) * 1000), 3)
    return batch


def breakdown(batches: list[dict]) -> dict:
    """Per phase of a master batch (batch_phases.PHASES): p50 and p99 over the batches (ms),
    and the phase's share of the batch thread's time over them all (its lane's phases)."""
    if not batches:
        return {"batches": 0}
    lane = sum(b["idle"] + b["took_ms"] for b in batches) or 1.0
    out: dict = {"batches": len(batches), "entries_p50": median(b["entries"] for b in batches)}
    for phase in PHASES:
        values = [b[phase] for b in batches]
        q = {"p50_ms": round(median(values), 2), "p99_ms": round(quantile(values, 0.99), 2)}
        if phase in BATCH_PHASES:
            q["share"] = round(sum(values) / lane, 3)
        out[phase] = q
    return out


def met(summary: dict) -> dict:
    """Each target of ``TARGETS`` against the median of the rounds: the median, the target, met."""
    out = {}
    for key, (sense, bound) in TARGETS.items():
        fig = summary.get(key)
        value = None if fig is None else fig["median"]
        ok = value is not None and (value >= bound if sense == ">=" else value <= bound)
        out[key] = {"median": value, "target": f"{sense} {bound}", "met": ok}
    return out


def flow_vs_passthrough(load: Load, say=lambda text: None) -> dict:
    """The pair and its floor on fresh local services, interleaved (module doc); the keys of
    ``twinflow bench flow-vs-passthrough --json``."""
    base = tempfile.mkdtemp(prefix="twinflow-bench-")
    services = LocalServices.start(base_dir=base, deadline_s=60)
    rcpu, zcpu = ServerCpu(services.redis.pid), ServerCpu(services.zookeeper.pid)
    runs: list[dict] = []
    burst_batches: list[dict] = []
    steady_batches: list[dict] = []
    readers = pair = None
    try:
        say(f"starting two bare readers (batch size {load.batch_size:,}) and the pair on the chained flow")
        readers = BareReaders(services.redis_url, load.batch_size, os.path.join(base, "readers")).start()
        pair = Pair(services).start()
        for r in range(load.rounds):
            run: dict = {"round": r + 1}
            sides = ("bare", "pair") if r % 2 == 0 else ("pair", "bare")
            for side in sides:
                rcpu.start()
                zcpu.start()
                began = time.time()
                b = readers.burst(load.messages) if side == "bare" else pair.burst(load.messages)
                redis_ticks, zk_ticks = rcpu.stop(), zcpu.stop()
                if side == "bare":
                    run["two_msgs_per_s"] = round(b["msgs_per_s"])
                    run["two_cpu_us_per_msg"] = per_message_us(b["ticks"] + redis_ticks, load.messages)
                    run["two_redis_cpu_us_per_msg"] = per_message_us(redis_ticks, load.messages)
                else:
                    burst_batches += pair.batches(began, time.time())
                    run["pair_msgs_per_s"] = round(b["msgs_per_s"])
                    run["pair_cpu_us_per_msg"] = per_message_us(b["ticks"] + redis_ticks + zk_ticks, load.messages)
                    run["pair_redis_cpu_us_per_msg"] = per_message_us(redis_ticks, load.messages)
            for side in sides:
                if side == "bare":
                    lat = readers.steady(load.rate, load.seconds)
                    run["bare_p50_ms"], run["bare_p99_ms"] = percentile_ms(lat, 0.5), percentile_ms(lat, 0.99)
                else:
                    pair.settle()
                    began = time.time()
                    lat = pair.steady(load.rate, load.seconds)
                    steady_batches += pair.batches(began, time.time())
                    run["pair_p50_ms"], run["pair_p99_ms"] = percentile_ms(lat, 0.5), percentile_ms(lat, 0.99)
            run["ratio_two"] = ratio(run["pair_msgs_per_s"], run["two_msgs_per_s"])
            run["cpu_ratio"] = ratio(run["pair_cpu_us_per_msg"], run["two_cpu_us_per_msg"])
            run["p50_ratio"] = ratio(run["pair_p50_ms"], run["bare_p50_ms"])
            runs.append(run)
            say(f"round {r + 1}: pair {run['pair_msgs_per_s']:,} msg/s, two bare {run['two_msgs_per_s']:,} "
                f"(ratio_two {run['ratio_two']}); CPU {run['pair_cpu_us_per_msg']} / {run['two_cpu_us_per_msg']} "
                f"µs per message; p50 {run['pair_p50_ms']} / {run['bare_p50_ms']} ms, p99 {run['pair_p99_ms']} ms")
    finally:
        for side in (pair, readers):
            if side is not None:
                side.stop()
        services.stop()
    summary = summarise([{k: v for k, v in run.items() if k != "round"} for run in runs])
    m = {k: (v["median"] if v else None) for k, v in summary.items()}
    return {
        "messages": load.messages, "rate": load.rate, "rounds": load.rounds, "batch_size": load.batch_size,
        "runs": runs, "summary": summary, "targets": met(summary),
        "breakdown": {"bursts": breakdown(burst_batches), "steady": breakdown(steady_batches)},
        # The medians under the names earlier results use (bench/results, docs/performance/throughput.md).
        "flow_msgs_per_s": m["pair_msgs_per_s"], "two_passthrough_msgs_per_s": m["two_msgs_per_s"],
        "ratio_two": m["ratio_two"], "p50_latency_ms": m["pair_p50_ms"], "p99_latency_ms": m["pair_p99_ms"],
        "passthrough_p50_ms": m["bare_p50_ms"], "passthrough_p99_ms": m["bare_p99_ms"],
        "flow_cpu_us_per_msg": m["pair_cpu_us_per_msg"], "two_passthrough_cpu_us_per_msg": m["two_cpu_us_per_msg"],
    }


if __name__ == "__main__":  # a bare reader child: one JSON argument, one JSON line out
    spec = json.loads(sys.argv[1])
    print(json.dumps(_reader_child(spec["redis_url"], spec["uplink"], spec["sink"], spec["batch_size"],
                                   spec["workdir"])))
