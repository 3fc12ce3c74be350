"""CPU per message of a sharded flow on a real Spark standalone cluster, next to its floors,
interleaved in one invocation.

One standalone master and worker on loopback serve every configuration, each started once and
kept alive across the rounds:

- ``shards1``, ``shards2``: a pair of peers (``twinflow run --spark-master spark://...``, each
  peer an application with ``spark.cores.max`` cores of the cluster) on the chained flow
  (history -> AND join -> action, claim pair) in 1 and 2 uplink shards, routed by
  ``uplink.shard_key``; each shard's batches run on the executors;
- ``passthrough1``, ``passthrough2``: the bare sharded passthrough (``twinflow_dev.
  shard_passthrough``) over 1 and 2 shards on the same cluster: the shard source and the
  ``mapInArrow`` plumbing of a sharded flow, each task copying its entries to a sink stream;
- ``pair`` (unless ``--no-pair``): the same chained flow unsharded, a driver-side pair
  (``local[1]``, no cluster): the reference "sharded ≤ 1.5 × pair" is measured against.

Each configuration has its own Redis (and ZooKeeper), so the Redis each one uses is its own.
Each round bursts every configuration in turn (``--messages``, default 20,000, published as
fast as Redis pipelines go); per burst: messages per second (first publish to every shard's
processed mark passing its last entry) and CPU microseconds per message of everything the
configuration runs: each peer (or the passthrough's driver) with everything it started (its
JVM, its Python workers), its executors with their Python workers (the executors of its
applications, found by the application's name on the master), the Spark worker and master
JVMs (shared, charged whole to the burst: their bookkeeping is a small constant), and its
Redis (``bench_stats.ServerCpu``). A first round warms up and is not counted (each executor's
Python workers start in it, about a CPU-second each). Printed and saved (``results/
shards.jsonl``): each burst, and per configuration the median and spread of each figure over
the rounds, with the ratios sharded ÷ passthrough, sharded ÷ pair and 2-shard ÷ 1-shard.

    .venv/bin/python bench/shards.py                  # 5 rounds, about 8 minutes on 2 cores

Under failure: a configuration that does not get ready or finish a burst within its deadline
raises with what it waited for; every process started here is stopped by PID (the clusters,
the passthroughs, the Spark cluster), also when a round fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import save  # noqa: E402

from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.shards import ShardRouter  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402
from twinflow_dev.bench_stats import ServerCpu, ratio, summarise, us_per_message  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.testing.messages import CHAINED, order_or_payment  # noqa: E402
from twinflow.testing.proc_stats import cpu_ticks, process_ticks  # noqa: E402
from twinflow.testing.servers import stop_pid  # noqa: E402
from twinflow.testing.services import LocalServices  # noqa: E402
from twinflow_dev.shard_passthrough import stream_keys  # noqa: E402
from twinflow.testing.spark_standalone import StandaloneSpark  # noqa: E402

UPLINK = "uplink: {stream: uplink, batch_size: 2000}"
SHARD_KEY = "{order_id}"
PUBLISH_CHUNK = 2000


def executor_pids(spark: StandaloneSpark, prefix: str) -> list[int]:
    """The executor JVMs of the applications whose name starts with ``prefix`` (their Python
    workers are their descendants)."""
    state = spark.state(5.0) or {}
    apps = {a["id"] for a in state.get("activeapps", []) if a.get("name", "").startswith(prefix)}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv and b"--app-id" in argv:
            if argv[argv.index(b"--app-id") + 1].decode() in apps:
                pids.append(int(entry))
    return pids


class Config:
    """One configuration: its processes, its Redis, where a burst goes and when it is done."""

    name = ""
    redis = None              # a client of its own Redis
    redis_pid = 0
    router: ShardRouter
    uplinks: list[str]        # per shard
    marks: list[str]          # per shard: the processed mark that passes a burst's last entry

    def driver_pids(self) -> dict[str, int]:
        raise NotImplementedError

    def extra(self) -> dict:
        return {}

    def stop(self) -> None:
        raise NotImplementedError


class FlowConfig(Config):
    """Two peers on the chained flow: sharded on the Spark cluster, or the driver-side pair."""

    def __init__(self, name: str, workdir: Path, shards: int | None, spark: StandaloneSpark | None, cores: int,
                 conf: list[str] = ()):
        self.name, self.shards = name, shards
        text = CHAINED.read_text()
        if shards:
            text = text.replace(UPLINK, f'uplink: {{stream: uplink, batch_size: 2000, shards: {shards}, '
                                        f'shard_key: "{SHARD_KEY}"}}')
        extra = [] if spark is None else [
            "--spark-master", spark.master_url, "--spark-conf", f"spark.cores.max={cores}",
            "--spark-conf", "spark.executor.memory=1g", *conf]
        self.cluster = LocalCluster(str(workdir / name), flow=name, text=text, peers=("a", "b"),
                                    peer_args=extra).start()
        self.redis, self.redis_pid, self.router = self.cluster.redis, self.cluster.services.redis.pid, self.cluster.router
        keys = self.cluster.shard_keys if shards else [self.cluster.keys]
        self.uplinks, self.marks = [k.uplink for k in keys], [k.processed for k in keys]

    def wait_ready(self, deadline_s: float) -> None:
        if not self.shards:
            self.cluster.wait_ready(deadline_s)
            return
        n = self.shards

        def ready() -> bool:
            st = {p: self.cluster.shard_statuses(p) for p in ("a", "b")}
            return (all(st[p][k].get("streaming") == "1" for p in st for k in range(n))
                    and all(any(st[p][k].get("role") == "master" for p in st) for k in range(n)))
        if not wait_for(ready, deadline_s, 0.2):
            raise RuntimeError(f"{self.name}: peers not ready in {deadline_s:.0f} s:\n{self.cluster.logs()}")

    def driver_pids(self) -> dict[str, int]:
        return {f"peer_{p}": proc.pid for p, proc in self.cluster.peers.items()}

    def extra(self) -> dict:
        if not self.shards:
            return {}
        st = {p: self.cluster.shard_statuses(p) for p in ("a", "b")}
        masters = [next((p for p in st if st[p][k].get("role") == "master"), None) for k in range(self.shards)]
        return {"masters": masters,
                "state_loads": [int(st[m][k].get("state_loads") or 0) if m else None for k, m in enumerate(masters)]}

    def stop(self) -> None:
        self.cluster.stop()


class PassthroughConfig(Config):
    """The bare sharded passthrough on the Spark cluster, with a Redis of its own."""

    def __init__(self, name: str, workdir: Path, shards: int, spark: StandaloneSpark, cores: int,
                 conf: list[str] = ()):
        import redis as redis_lib

        self.name, self.shards = name, shards
        self.services = LocalServices.start(base_dir=str(workdir / name / "services"), zookeeper=False)
        self.redis_pid = self.services.redis.pid
        self.redis = redis_lib.Redis.from_url(self.services.redis_url)
        self.router = ShardRouter(shards, SHARD_KEY)
        keys = [stream_keys(name, k) for k in range(shards)]
        self.uplinks, self.marks = [k[0] for k in keys], [k[2] for k in keys]
        self.log = workdir / name / "passthrough.log"
        argv = [sys.executable, "-m", "twinflow_dev.shard_passthrough", "--redis-url", self.services.redis_url,
                "--spark-master", spark.master_url, "--prefix", name, "--shards", str(shards),
                "--workdir", str(workdir / name), "--spark-conf", f"spark.cores.max={cores}",
                "--spark-conf", "spark.executor.memory=1g", *conf]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def wait_ready(self, deadline_s: float) -> None:
        if not wait_for(lambda: self.proc.poll() is not None or self.redis.get(f"{self.name}:ready"), deadline_s, 0.2) \
                or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name}: not ready in {deadline_s:.0f} s:\n{self.log.read_text()[-3000:]}")

    def driver_pids(self) -> dict[str, int]:
        return {"driver": self.proc.pid}

    def stop(self) -> None:
        stop_pid(self.proc.pid, 20)
        self.services.stop()


def python_workers(executors: list[int]) -> list[int]:
    """The Python processes under ``executors``: each ``pyspark.daemon`` and its forks (the
    workers, reused from task to task)."""
    from twinflow.testing.proc_stats import process_tree

    return [p for e in executors for p in process_tree(e) if p != e]


def start_py_spy(pids: list[int], out_dir: Path, tag: str):
    """py-spy sampling each daemon and its forks (200 Hz, without pausing them) until the
    returned call stops it (SIGINT: py-spy writes its file then)."""
    import signal

    py_spy = Path(sys.executable).parent / "py-spy"
    # Without --idle: the samples of a thread waiting (a worker for its next task) are left
    # out, so the samples tell where the CPU goes.
    procs = [subprocess.Popen([str(py_spy), "record", "--pid", str(pid), "--rate", "100",
                               "--nonblocking", "-f", "raw", "-o", str(out_dir / f"{tag}-{pid}.txt")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]

    def stop() -> None:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.wait(60)
    return stop


def burst(cfg: Config, spark: StandaloneSpark | None, seq: int, messages: int, py_spy_dir: Path | None = None) -> dict:
    """Publish ``messages`` messages (from ``seq``) to ``cfg`` and wait for them; the figures.
    With ``py_spy_dir``, the executors' Python workers are sampled over the burst."""
    docs = [json.dumps(order_or_payment(seq + i), separators=(",", ":")).encode() for i in range(messages)]
    shard_of = [cfg.router.shard_of(b) for b in docs]
    groups = {g: [pid] for g, pid in cfg.driver_pids().items()}
    if spark is not None and cfg.name != "pair":
        groups["executors"] = executor_pids(spark, f"twinflow-{cfg.name}-")
        assert groups["executors"], f"{cfg.name}: no executor found on the Spark worker"
    shared = [] if spark is None or cfg.name == "pair" else [spark.worker_pid, spark.master_pid]
    redis_cpu = ServerCpu(cfg.redis_pid)
    before = {g: sum(cpu_ticks(p, reaped=True) for p in pids) for g, pids in groups.items()}
    before_jvm = sum(process_ticks(p) for p in groups.get("executors", []))
    before_shared = sum(process_ticks(p) for p in shared)  # the daemons alone: executors are counted above
    stop_py_spy = None
    if py_spy_dir is not None and "executors" in groups:
        stop_py_spy = start_py_spy(python_workers(groups["executors"]), py_spy_dir, cfg.name)
        stop_drivers = start_py_spy(list(cfg.driver_pids().values()), py_spy_dir, f"{cfg.name}-driver")
        stop_py_spy = (lambda a, b: lambda: (a(), b()))(stop_py_spy, stop_drivers)
    redis_cpu.start()
    t0, started_ms = time.monotonic(), time.time() * 1000
    last: dict[int, str] = {}
    per_shard = [0] * len(cfg.uplinks)
    for i in range(0, messages, PUBLISH_CHUNK):
        pipe = cfg.redis.pipeline(transaction=False)
        for b, k in zip(docs[i:i + PUBLISH_CHUNK], shard_of[i:i + PUBLISH_CHUNK]):
            pipe.xadd(cfg.uplinks[k], {"data": b})
        for k, pos in zip(shard_of[i:i + PUBLISH_CHUNK], pipe.execute()):
            last[k] = pos.decode()
            per_shard[k] += 1

    def processed() -> bool:
        for k, pos in last.items():
            mark = cfg.redis.get(cfg.marks[k])
            if not mark or position_order(mark.decode()) < position_order(pos):
                return False
        return True
    if not wait_for(processed, 600, 0.01):
        raise RuntimeError(f"{cfg.name}: burst not processed in 600 s")
    wall = time.monotonic() - t0
    span = (started_ms, time.time() * 1000)
    if stop_py_spy is not None:
        stop_py_spy()
    ticks = {g: sum(cpu_ticks(p, reaped=True) for p in pids) - before[g] for g, pids in groups.items()}
    if "executors" in groups:  # of which the executors' JVMs themselves (the rest: their Python)
        jvm = sum(process_ticks(p) for p in groups["executors"]) - before_jvm
        split = {"executor_jvms_cpu_us_per_msg": us_per_message(jvm, messages),
                 "executor_pythons_cpu_us_per_msg": us_per_message(ticks["executors"] - jvm, messages)}
    ticks["spark_daemons"] = sum(process_ticks(p) for p in shared) - before_shared
    ticks["redis"] = redis_cpu.stop()
    row = {"config": cfg.name, "messages": messages, "msgs_per_s": round(messages / wall),
           "cpu_us_per_msg": us_per_message(sum(ticks.values()), messages),
           **{f"{g}_cpu_us_per_msg": us_per_message(t, messages) for g, t in ticks.items()},
           **(split if "executors" in groups else {}), "per_shard": per_shard, "span_ms": span}
    return {**row, **cfg.extra()}


def report(rows: list[dict], names: list[str]) -> dict:
    """Per configuration the median and spread of each figure; the ratios of the medians."""
    per = {n: summarise([r for r in rows if r["config"] == n], 1) for n in names}

    def cpu(n: str) -> float | None:
        s = per.get(n, {}).get("cpu_us_per_msg")
        return s["median"] if s else None
    ratios = {}
    for k in (1, 2):
        ratios[f"shards{k}_over_passthrough{k}"] = ratio(cpu(f"shards{k}"), cpu(f"passthrough{k}"))
        ratios[f"shards{k}_over_pair"] = ratio(cpu(f"shards{k}"), cpu("pair"))
    ratios["shards2_over_shards1"] = ratio(cpu("shards2"), cpu("shards1"))
    ratios["passthrough2_over_passthrough1"] = ratio(cpu("passthrough2"), cpu("passthrough1"))
    # Per round too: a ratio of two figures measured minutes apart in the same round is
    # less exposed to the machine's drift than the ratio of two medians.
    for num, den in (("shards1", "passthrough1"), ("shards2", "passthrough2"), ("shards2", "shards1"),
                     ("shards1", "pair"), ("shards2", "pair")):
        per_round = []
        for rnd in sorted({r["round"] for r in rows}):
            a = [r["cpu_us_per_msg"] for r in rows if r["round"] == rnd and r["config"] == num]
            b = [r["cpu_us_per_msg"] for r in rows if r["round"] == rnd and r["config"] == den]
            if a and b:
                per_round.append(ratio(a[0], b[0]))
        ratios[f"{num}_over_{den}_per_round"] = summarise([{"r": v} for v in per_round]).get("r") if per_round else None
    return {"figures": per, "ratios": ratios}


def print_report(out: dict) -> None:
    figures = ("msgs_per_s", "cpu_us_per_msg", "executors_cpu_us_per_msg", "redis_cpu_us_per_msg")
    print(f"{'config':<14}" + "".join(f"{f:>34}" for f in figures))
    for name, per in out["figures"].items():
        cells = []
        for f in figures:
            s = per.get(f)
            cells.append(f"{s['median']:>12,.1f} [{s['min']:,.1f}-{s['max']:,.1f}] ±{s['spread']:.0%}" if s else "-")
        print(f"{name:<14}" + "".join(f"{c:>34}" for c in cells))
    print(json.dumps(out["ratios"], indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--cores", type=int, default=2, help="spark.cores.max of each application")
    ap.add_argument("--configs", nargs="+",
                    default=["pair", "shards1", "shards2", "passthrough1", "passthrough2"])
    ap.add_argument("--no-pair", action="store_true", help="leave the driver-side pair out")
    ap.add_argument("--note", default="", help="saved with the figures (what code was measured)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--variant", action="append", default=[], metavar="SUFFIX:KEY=VALUE",
                    help="run each Spark configuration also as NAME+SUFFIX (lower-case letters) with this "
                         "Spark setting, interleaved with the others; repeat for more settings")
    ap.add_argument("--profile", type=Path, default=None,
                    help="a directory: Spark event logs (task metrics over the counted bursts) and py-spy "
                         "samples of the executors' Python workers in the last round")
    args = ap.parse_args()
    conf = []
    if args.profile:
        (args.profile / "eventlog").mkdir(parents=True, exist_ok=True)
        conf = ["--spark-conf", "spark.eventLog.enabled=true",
                "--spark-conf", f"spark.eventLog.dir=file://{(args.profile / 'eventlog').resolve()}",
                "--spark-conf", "spark.eventLog.compress=false"]
    names = [n for n in args.configs if not (args.no_pair and n == "pair")]
    # --variant SUFFIX:KEY=VALUE: each Spark configuration again as NAME+SUFFIX with that Spark
    # setting too, interleaved with the others (a setting's effect within one invocation).
    variants: dict[str, list[str]] = {}
    for v in args.variant:
        suffix, setting = v.split(":", 1)
        variants.setdefault(suffix, []).extend(["--spark-conf", setting])
    names += [n + suffix for suffix in variants for n in list(names) if n != "pair"]
    workdir = Path(tempfile.mkdtemp(prefix="twinflow-bench-shards-"))
    apps = sum(2 if n.startswith("shards") else 1 for n in names if n != "pair")
    # Standalone cores are slots, not CPUs: offer every application its spark.cores.max.
    spark = StandaloneSpark.start(str(workdir / "spark"), cores=apps * args.cores, memory=f"{apps + 1}g")
    configs: list[Config] = []
    rows: list[dict] = []
    try:
        for n in names:
            base = n.rstrip("abcdefghijklmnopqrstuvwxyz_-") if n != "pair" else n
            extra = conf + variants.get(n[len(base):], [])
            # One at a time: nine JVMs starting at once on two cores left a Python worker over
            # Spark's time to connect back (its query failed at start-up).
            if n == "pair":
                configs.append(FlowConfig(n, workdir, None, None, args.cores))
            elif n.startswith("shards"):
                configs.append(FlowConfig(n, workdir, int(base[len("shards"):]), spark, args.cores, extra))
            else:
                configs.append(PassthroughConfig(n, workdir, int(base[len("passthrough"):]), spark, args.cores, extra))
            configs[-1].wait_ready(300)
        seq = 0
        for rnd in range(args.rounds + 1):  # round 0 warms up (each executor's Python workers start)
            for cfg in configs:
                profiled = args.profile if args.profile and rnd == args.rounds else None
                row = burst(cfg, None if cfg.name == "pair" else spark, seq, args.messages, profiled)
                seq += args.messages
                row["round"] = rnd
                print(json.dumps(row), flush=True)
                if rnd and not profiled:  # py-spy's sampling slows what it samples: not counted
                    rows.append(row)
    finally:
        for cfg in configs:
            try:
                cfg.stop()
            except Exception as exc:  # noqa: BLE001  (stop the others all the same)
                print(f"stopping {cfg.name}: {exc}", file=sys.stderr)
        spark.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    out = report(rows, names)
    if args.profile:
        from spark_task_metrics import task_metrics

        out["task_metrics"] = {
            n: task_metrics(args.profile / "eventlog", [tuple(r["span_ms"]) for r in rows if r["config"] == n],
                            args.messages * sum(1 for r in rows if r["config"] == n), f"twinflow-{n}-")
            for n in names if n != "pair"}
        print(json.dumps(out["task_metrics"], indent=1))
    print_report(out)
    save("shards", {"note": args.note, "messages": args.messages, "rounds": args.rounds,
                    "cores_per_app": args.cores, **out, "runs": rows})


if __name__ == "__main__":
    main()
