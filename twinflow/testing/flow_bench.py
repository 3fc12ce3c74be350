"""``twinflow bench flow-vs-passthrough``: the two-peer cluster next to bare Spark, in one run.

Both halves run on the same machine, one after the other, against one local
Redis (and ZooKeeper for the cluster):

- passthrough: twinflow's own Spark session and Redis-stream source, with
  nothing of the flow: ``foreachBatch`` copies every uplink entry to a Redis
  stream with one pipeline per batch. It runs in a child process (its own
  driver and JVM, gone before the cluster starts), once per batch size in
  ``PASSTHROUGH_BATCH_SIZES``; the best one's burst rate counts.
- two bare readers: the same passthrough twice at once, each in a child
  process of its own, reading one uplink and copying it to a sink of its
  own, at the passthrough's best batch size: the floor of an active-active
  pair, which reads every uplink entry twice on the same machine. The
  slower copy's rate counts (``two_passthrough_msgs_per_s``; the pair's
  over it is ``ratio_two``).
- flow: two ``twinflow run`` peers on the chained flow
  (``examples/cluster-chained.yaml``: history -> AND join of an order and
  its payment -> action, with the claim pair), the messages of ``twinflow
  demo`` (one order in ten alone, one in ten sent twice).

Figures: a burst of N messages published as fast as Redis pipelines go,
messages per second from the first publish until every one is done (the
passthrough's sink holds all N; the flow's processed mark passes the last),
the median of ``bursts`` bursts one after the other (default 3: one burst
on 2 shared cores swings by 10-15%, more than most changes measured with
it; every burst's rate is in ``--json``);
then latency at a steady rate (2,000 msg/s for 15 s by default): a sink
entry's Redis time minus the uplink entry's Redis time (for a joined pair,
its later member), p50 and p99. Each measured span starts from a warm query
with nothing left to do: the passthrough's on a query of its own; the
pair's once it has settled after the bursts (``settled``: both readers past
the last message, the join's groups closed by their time-outs, 10 s on the
chained flow). The pair's steady load right after the bursts, as the bench
measured it until 2026-11-28, is reported too (``p50_after_bursts_ms``,
``p99_after_bursts_ms``): it also meets the bursts' aftermath, 2,500
time-outs per burst among them.
CPU: the ticks of every process of the measured trees (a peer or a reader:
its Python, its JVM, the JVM's Python workers) over the burst, in
microseconds per message; Redis and the publisher are not counted.

Under failure: a half that does not finish within its deadline raises
BenchError with what it was waiting for; every process it started is
stopped by PID (the Cluster and LocalServices own them).
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

from ..runtime.flowgraph import FlowGraph
from ..runtime.nodes.history import HistoryNode
from ..runtime.nodes.sort import SortNode
from ..runtime.positions import position_order
from ..runtime.store.flow_keys import FlowKeys
from ..runtime.store.flow_store import FlowStore
from ..runtime.waiting import wait_for
from .local_cluster import LocalCluster
from .messages import CHAINED, order_or_payment
from .proc_stats import TICKS, cpu_ticks
from .producers import UplinkPublisher
from .services import LocalServices

PASSTHROUGH_BATCH_SIZES = (2000, 10_000, 50_000)


class BenchError(RuntimeError):
    """A half of the bench did not finish in time; the message says what it waited for."""


@dataclass
class Load:
    messages: int = 50_000
    rate: float = 2000.0
    seconds: float = 15.0
    bursts: int = 3  # each half's rate is the median of this many bursts in a row

    def __post_init__(self) -> None:
        if self.messages < 1 or self.bursts < 1:
            raise ValueError(f"a bench needs at least one message and one burst (got {self.messages}, {self.bursts})")


def median(values: list[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    values = sorted(values)
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2


def percentile_ms(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of seconds, in milliseconds (nearest rank)."""
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def per_message_us(ticks: int, messages: int) -> float:
    """CPU ticks spent on ``messages`` messages, in microseconds per message."""
    return round(ticks / TICKS / messages * 1e6, 1)


def entry_ms(position: str) -> int:
    """The Redis time (ms) in a stream entry ID."""
    return position_order(position)[0]


def passthrough_doc(seq: int) -> dict:
    return {"id": f"p{seq}", "seq": seq}


# -- the passthrough half (child process) -------------------------------------
def _passthrough_child(redis_url: str, load: Load, batch_sizes: tuple[int, ...], workdir: str) -> dict:
    """Run in the child: every batch size's burst, then latency at the best one."""
    from ..runtime.spark.session import build_session
    from ..runtime.spark.stream import stop_stream

    spark = build_session("twinflow-bench-passthrough")
    client = redis.Redis.from_url(redis_url)

    def run(tag: str, batch_size: int, body) -> None:
        uplink, sink = f"pt:{tag}:uplink", f"pt:{tag}:sink"
        query = _start_copy(spark, client, redis_url, uplink, sink, batch_size, f"{workdir}/{tag}")
        try:
            body(uplink, sink)
        finally:
            stop_stream(query, 30)

    def wait_sink(sink: str, n: int, what: str) -> None:
        if not wait_for(lambda: client.xlen(sink) >= n, 600, 0.01):
            raise BenchError(f"passthrough: {what}: the sink has {client.xlen(sink)} of {n} in 600 s")

    bursts, cpu = {}, {}
    for size in batch_sizes:
        def burst(uplink, sink, size=size):
            pub = UplinkPublisher(client, uplink, passthrough_doc)
            rates, ticks = [], cpu_ticks(os.getpid(), reaped=True)
            for k in range(1, load.bursts + 1):
                t0 = time.monotonic()
                pub.publish(load.messages)
                wait_sink(sink, k * load.messages, f"burst {k} at batch size {size}")
                rates.append(load.messages / (time.monotonic() - t0))
            bursts[size] = median(rates)
            cpu[size] = per_message_us(cpu_ticks(os.getpid(), reaped=True) - ticks, load.messages * load.bursts)
        run(f"burst{size}", size, burst)
    best = max(bursts, key=bursts.get)
    lat: list[float] = []

    def steady(uplink, sink):
        pub = UplinkPublisher(client, uplink, passthrough_doc)
        pub.steady(load.rate, load.seconds)
        wait_sink(sink, pub.seq, "steady load")
        for sink_id, fields in client.xrange(sink):
            lat.append((entry_ms(sink_id.decode()) - entry_ms(fields[b"position"].decode())) / 1000)

    run("steady", best, steady)
    spark.stop()
    return {"burst_msgs_per_s": {str(k): round(v) for k, v in bursts.items()}, "best_batch_size": best,
            "msgs_per_s": round(bursts[best]), "cpu_us_per_msg": cpu[best], "p50_ms": percentile_ms(lat, 0.5),
            "p99_ms": percentile_ms(lat, 0.99), "latency_samples": len(lat)}


def _start_copy(spark, client: redis.Redis, redis_url: str, uplink: str, sink: str, batch_size: int,
                checkpoint_dir: str):
    """A bare passthrough query (twinflow's session and source, nothing of the flow) copying
    every entry of ``uplink`` to ``sink`` with one pipeline per batch; returns it once its
    warm-up batch has run."""
    from ..runtime.positions import WARMUP_POSITION
    from ..runtime.spark.stream import start_stream, stop_stream

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


def _reader_child(redis_url: str, uplink: str, sink: str, batch_size: int, n: int, workdir: str) -> dict:
    """Run in a child of :func:`two_passthroughs`: one bare reader copying ``uplink`` to
    ``sink``; prints "ready" once its query is warm, returns once its sink holds ``n``."""
    from ..runtime.spark.session import build_session
    from ..runtime.spark.stream import stop_stream

    spark = build_session("twinflow-bench-reader")
    client = redis.Redis.from_url(redis_url)
    query = _start_copy(spark, client, redis_url, uplink, sink, batch_size, f"{workdir}/{sink}")
    try:
        print("ready", flush=True)
        if not wait_for(lambda: client.xlen(sink) >= n, 600, 0.05):
            raise BenchError(f"reader {sink}: the sink has {client.xlen(sink)} of {n} in 600 s")
    finally:
        stop_stream(query, 30)
        spark.stop()
    return {"sink": sink}


def passthrough(redis_url: str, load: Load, batch_sizes=PASSTHROUGH_BATCH_SIZES) -> dict:
    """The passthrough half, in a child process with its own Spark driver."""
    with tempfile.TemporaryDirectory(prefix="twinflow-passthrough-") as workdir:
        args = json.dumps({"redis_url": redis_url, "load": load.__dict__, "batch_sizes": list(batch_sizes),
                           "workdir": workdir})
        proc = subprocess.run([sys.executable, "-m", __name__, args], capture_output=True, text=True,
                              timeout=1800)
    if proc.returncode != 0:
        raise BenchError(f"passthrough child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def two_passthroughs(redis_url: str, load: Load, batch_size: int) -> dict:
    """The floor of an active-active pair: two bare readers, each in its own child process (its
    own driver and JVM), copying the same uplink to a sink of its own at once. Rate: ``N`` over
    the time until the slower one's sink holds all; CPU: both readers' process trees, from the
    first publish until each one's sink is full."""
    uplink, sinks = "pt:two:uplink", ("pt:two:sink1", "pt:two:sink2")
    client = redis.Redis.from_url(redis_url)
    with tempfile.TemporaryDirectory(prefix="twinflow-two-readers-") as workdir:
        children = []
        try:
            for sink in sinks:
                args = json.dumps({"reader": True, "redis_url": redis_url, "uplink": uplink, "sink": sink,
                                   "batch_size": batch_size, "n": load.messages * load.bursts,
                                   "workdir": workdir})
                children.append(subprocess.Popen([sys.executable, "-m", __name__, args], stdout=subprocess.PIPE,
                                                 stderr=subprocess.DEVNULL, text=True))
            for child in children:  # "ready" once warm; a child that fails ends without it
                if not any(line.strip() == "ready" for line in iter(child.stdout.readline, "")):
                    raise BenchError(f"a bare reader ended before it was ready (exit {child.wait(30)})")
            ticks = [cpu_ticks(c.pid, reaped=True) for c in children]
            pub = UplinkPublisher(client, uplink, passthrough_doc)
            slower, faster, used = [], [], {}
            for k in range(1, load.bursts + 1):
                t0 = time.monotonic()
                pub.publish(load.messages)
                took = {}
                deadline = t0 + 600
                while len(took) < len(sinks) and time.monotonic() < deadline:
                    for i, sink in enumerate(sinks):
                        if i not in took and client.xlen(sink) >= k * load.messages:
                            took[i] = time.monotonic() - t0
                            used[i] = cpu_ticks(children[i].pid, reaped=True) - ticks[i]
                    time.sleep(0.01)  # a poll's pace; the deadline bounds the loop
                if len(took) < len(sinks):
                    raise BenchError(f"two bare readers, burst {k}: {len(took)} of 2 sinks full in 600 s")
                slower.append(load.messages / max(took.values()))
                faster.append(load.messages / min(took.values()))
            for child in children:
                child.wait(60)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
    return {"msgs_per_s": round(median(slower)), "faster_msgs_per_s": round(median(faster)),
            "burst_msgs_per_s": [round(r) for r in slower],
            "cpu_us_per_msg": per_message_us(sum(used.values()), load.messages * load.bursts), "batch_size": batch_size}


# -- the flow half ------------------------------------------------------------
def flow(services: LocalServices, load: Load, text: str | None = None, peer_args: tuple[str, ...] = ()) -> dict:
    """The two-peer cluster on the chained flow (``text``: another flow file of orders and
    payments; ``peer_args``: more ``twinflow run`` arguments for both peers)."""
    workdir = tempfile.mkdtemp(prefix="twinflow-bench-flow-")
    name = "benchflow"
    cluster = LocalCluster(workdir, flow=name, services=services, text=text or CHAINED.read_text(),
                           peer_args=peer_args).start(peers=False)
    store = FlowStore(cluster.redis, FlowKeys(name), "bench")
    pub = UplinkPublisher(cluster.redis, store.keys.uplink, order_or_payment)

    def processed_past(position: str) -> bool:
        mark = store.processed_mark()
        return mark is not None and position_order(mark) >= position_order(position)

    try:
        cluster.start_peers()
        cluster.wait_ready()
        pids = [p.pid for p in cluster.peers.values()]
        ticks, rates = sum(cpu_ticks(p, reaped=True) for p in pids), []
        for k in range(1, load.bursts + 1):
            t0 = time.monotonic()
            pub.publish(load.messages)
            if not wait_for(lambda: processed_past(pub.last), 900, 0.01):
                raise BenchError(f"flow: burst {k} was not processed in 900 s\n{cluster.logs()}")
            rates.append(load.messages / (time.monotonic() - t0))
        cpu = per_message_us(sum(cpu_ticks(p, reaped=True) for p in pids) - ticks, load.messages * load.bursts)

        def steady_latency(what: str) -> list[float]:
            since = cluster.redis.time()
            since_ms = since[0] * 1000 + since[1] // 1000
            pub.steady(load.rate, load.seconds)
            if not wait_for(lambda: processed_past(pub.last), 300, 0.01):
                raise BenchError(f"flow: the steady load {what} was not processed in 300 s\n{cluster.logs()}")
            lat = []
            for sink_id, fields in cluster.redis.xrange(cluster.sink_key, min=f"{since_ms}-0"):
                # A joined pair leaves as one message whose ID joins its members' with "+".
                members = json.loads(fields[b"ids"]) if b"ids" in fields else fields[b"id"].decode().split("+")
                written = [pub.written_ms[m] for m in members if m in pub.written_ms]
                if written:
                    lat.append((entry_ms(sink_id.decode()) - max(written)) / 1000)
            return lat

        after_bursts = steady_latency("after the bursts")
        # The bare reader's steady load meets a query with nothing left to do; the pair's, right
        # after the bursts, also meets their aftermath (the time-outs of the join's lone orders,
        # a worker still reading the tail). The same conditions for both: wait until that is done.
        if not wait_for(lambda: settled(cluster.redis, store.keys, cluster.graph, list(cluster.peers), pub.last),
                        120, 0.05):
            raise BenchError(f"flow: the pair did not settle after the bursts in 120 s\n{cluster.logs()}")
        lat = steady_latency("on the settled pair")
        return {"msgs_per_s": round(median(rates)), "burst_msgs_per_s": [round(r) for r in rates],
                "cpu_us_per_msg": cpu, "p50_ms": percentile_ms(lat, 0.5),
                "p99_ms": percentile_ms(lat, 0.99), "latency_samples": len(lat),
                "p50_after_bursts_ms": percentile_ms(after_bursts, 0.5),
                "p99_after_bursts_ms": percentile_ms(after_bursts, 0.99)}
    finally:
        cluster.stop()


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


def flow_vs_passthrough(load: Load, say=lambda text: None) -> dict:
    """Both halves on fresh local services; the keys of ``twinflow bench flow-vs-passthrough --json``."""
    base = tempfile.mkdtemp(prefix="twinflow-bench-")
    services = LocalServices.start(base_dir=base, deadline_s=60)
    try:
        say(f"passthrough: {load.messages} messages at batch sizes {PASSTHROUGH_BATCH_SIZES}, "
            f"then {load.rate:.0f} msg/s for {load.seconds:.0f} s")
        bare = passthrough(services.redis_url, load)
        say(f"passthrough: {bare['msgs_per_s']} msg/s (batch size {bare['best_batch_size']}), "
            f"p50 {bare['p50_ms']} ms, p99 {bare['p99_ms']} ms")
        say(f"two bare readers on one uplink at once: {load.messages} messages at batch size {bare['best_batch_size']}")
        two = two_passthroughs(services.redis_url, load, bare["best_batch_size"])
        say(f"two bare readers: {two['msgs_per_s']} msg/s (the slower), {two['cpu_us_per_msg']} µs CPU per message")
        say("flow: two peers on the chained flow")
        pair = flow(services, load)
        say(f"flow: {pair['msgs_per_s']} msg/s, p50 {pair['p50_ms']} ms, p99 {pair['p99_ms']} ms")
    finally:
        services.stop()
    return {
        "messages": load.messages, "rate": load.rate, "bursts": load.bursts,
        "flow_burst_msgs_per_s": pair["burst_msgs_per_s"], "two_passthrough_burst_msgs_per_s": two["burst_msgs_per_s"],
        "passthrough_msgs_per_s": bare["msgs_per_s"], "flow_msgs_per_s": pair["msgs_per_s"],
        "ratio": round(pair["msgs_per_s"] / bare["msgs_per_s"], 3),
        "passthrough_p50_ms": bare["p50_ms"], "passthrough_p99_ms": bare["p99_ms"],
        "p50_latency_ms": pair["p50_ms"], "p99_latency_ms": pair["p99_ms"],
        "p50_after_bursts_ms": pair["p50_after_bursts_ms"], "p99_after_bursts_ms": pair["p99_after_bursts_ms"],
        "passthrough_batch_size": bare["best_batch_size"], "passthrough_bursts": bare["burst_msgs_per_s"],
        "two_passthrough_msgs_per_s": two["msgs_per_s"],
        "ratio_two": round(pair["msgs_per_s"] / two["msgs_per_s"], 3),
        "flow_cpu_us_per_msg": pair["cpu_us_per_msg"], "passthrough_cpu_us_per_msg": bare["cpu_us_per_msg"],
        "two_passthrough_cpu_us_per_msg": two["cpu_us_per_msg"],
    }


if __name__ == "__main__":  # a passthrough or bare reader child: one JSON argument, one JSON line out
    spec = json.loads(sys.argv[1])
    if spec.get("reader"):
        result = _reader_child(spec["redis_url"], spec["uplink"], spec["sink"], spec["batch_size"], spec["n"],
                               spec["workdir"])
    else:
        result = _passthrough_child(spec["redis_url"], Load(**spec["load"]), tuple(spec["batch_sizes"]),
                                    spec["workdir"])
    print(json.dumps(result))
