"""CPU seconds per message with 1 and 2 uplink shards, on a real Spark standalone cluster.

For each shard count, a fresh pair of peers (``twinflow run --spark-master spark://...``, each
peer an application with ``spark.cores.max`` cores of the cluster) runs the chained flow
(history -> AND join -> action, claim pair) and takes bursts of N messages (default 50,000),
routed to the shards by ``uplink.shard_key``. Per burst: messages per second (first publish to
every shard's processed mark passing its last entry) and the CPU seconds per message of

- each peer process with everything it started (driver, its JVM and Python workers),
- the Spark worker with its executors (where each shard's batches run),
- Redis,

read from /proc (utime + stime, plus those of reaped children). A first burst warms up and is
not counted: each Spark task slot starts its Python workers then (about a CPU-second each,
which would land on whichever shard count has more slots). The same load, the same machine:
the figure must stay flat from 1 to 2 shards.

    .venv/bin/python bench/shards.py --shards 1 2 --messages 50000 --runs 2
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import TICKS, cpu_ticks  # noqa: E402
from common import save  # noqa: E402


from twinflow.testing.messages import CHAINED, order_or_payment  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow.testing.spark_standalone import StandaloneSpark  # noqa: E402
from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402

UPLINK = "uplink: {stream: uplink, batch_size: 2000}"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants, with the children each has reaped."""
    return cpu_ticks(pid, reaped=True) / TICKS


def run_shards(spark: StandaloneSpark, shards: int, messages: int, runs: int, cores: int,
               workdir: Path) -> list[dict]:
    name = f"shards{shards}"
    text = CHAINED.read_text().replace(
        UPLINK, f'uplink: {{stream: uplink, batch_size: 2000, shards: {shards}, shard_key: "{{order_id}}"}}')
    extra = ["--spark-master", spark.master_url, "--spark-conf", f"spark.cores.max={cores}",
             "--spark-conf", "spark.executor.memory=1g"]
    cluster = LocalCluster(str(workdir / name), flow=name, text=text, peers=("a", "b"), peer_args=extra).start()
    keys, router, r = cluster.shard_keys, cluster.router, cluster.redis
    peers = list(cluster.peers.values())

    def status(peer: str, k: int) -> dict:
        return cluster.shard_statuses(peer)[k]

    out = []
    try:
        ready = wait_for(lambda: all(status(n, k).get("streaming") == "1" for n in ("a", "b") for k in range(shards))
                         and all(any(status(n, k).get("role") == "master" for n in ("a", "b")) for k in range(shards)),
                         180, 0.2)
        assert ready, "peers not ready in 180 s"
        masters = [next(n for n in ("a", "b") if status(n, k).get("role") == "master") for k in range(shards)]
        seq = 0
        for run in range(runs + 1):  # run 0 warms up: each task slot's Python workers start (not counted)
            docs = [order_or_payment(seq + i) for i in range(messages)]
            seq += messages
            groups = {**{f"node_{p.peer_id}": [p.pid] for p in peers}, "spark_executors": [spark.worker_pid],
                      "redis": [cluster.services.redis.pid]}
            before = {g: sum(tree_cpu_s(p) for p in pids) for g, pids in groups.items()}
            t0 = time.monotonic()
            last: dict[int, str] = {}
            per_shard = [0] * shards
            for i in range(0, messages, 2000):
                pipe = r.pipeline(transaction=False)
                bodies = [json.dumps(d, separators=(",", ":")).encode() for d in docs[i:i + 2000]]
                shard_of = [router.shard_of(b) for b in bodies]
                for b, k in zip(bodies, shard_of):
                    pipe.xadd(keys[k].uplink, {"data": b})
                for k, pos in zip(shard_of, pipe.execute()):
                    last[k] = pos.decode()
                    per_shard[k] += 1

            def processed() -> bool:
                for k, pos in last.items():
                    mark = r.get(keys[k].processed)
                    if not mark or position_order(mark.decode()) < position_order(pos):
                        return False
                return True
            assert wait_for(processed, 600, 0.01), "burst not processed in 600 s"
            wall = time.monotonic() - t0
            cpu = {g: sum(tree_cpu_s(p) for p in pids) - before[g] for g, pids in groups.items()}
            total = sum(cpu.values())
            if run == 0:
                continue
            out.append({"shards": shards, "run": run, "messages": messages, "msgs_per_s": round(messages / wall),
                        "cpu_us_per_msg": round(total / messages * 1e6, 1),
                        **{f"{g}_cpu_us_per_msg": round(c / messages * 1e6, 1) for g, c in cpu.items()},
                        "per_shard": per_shard, "masters": masters,
                        "state_loads": [int(status(masters[k], k).get("state_loads") or 0) for k in range(shards)]})
            print(json.dumps(out[-1]), flush=True)
    finally:
        cluster.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cores", type=int, default=2, help="spark.cores.max of each peer's application")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="twinflow-bench-shards-"))
    spark = StandaloneSpark.start(str(workdir / "spark"), cores=2 * args.cores, memory="4g")
    try:
        rows = [row for n in args.shards
                for row in run_shards(spark, n, args.messages, args.runs, args.cores, workdir)]
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    save("shards", {"messages": args.messages, "cores_per_node": args.cores, "runs": rows})


if __name__ == "__main__":
    main()
