"""The chained flow next to the claim pair alone, on the two-peer cluster, in one run.

For each flow (first the claim pair alone, examples/cluster.yaml; then the
chained flow, examples/cluster-chained.yaml: history -> AND join -> action,
with the claim pair), on a fresh two-peer cluster:

- burst: N messages (default 50,000) published as fast as Redis pipelines
  go; messages per second until the master's processed mark passes the last;
- latency at a steady rate (default 2,000 msg/s for 15 s): per output, the
  time from the uplink write of its last member to the output's write, p50
  and p99; for the chained flow one order in twenty has no payment, and its
  join time-out (2 s here) fires under that load;
- timer lateness: output time minus due time of every time-out (``at`` of
  an expired group), p50 and p99, under the load above and with no load
  (a few lone orders on an idle peer);
- idle CPU: each peer's process tree (Python, JVM, workers) over 20 s idle,
  as a share of one core.

    .venv/bin/python bench/chained.py --messages 50000
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import TICKS, cpu_ticks, save  # noqa: E402

from twinflow.testing.checker import check_outputs  # noqa: E402
from twinflow.testing.local_cluster import LocalCluster  # noqa: E402
from twinflow_dev.flow_bench import percentile_ms as pct  # noqa: E402
from twinflow.runtime.waiting import wait_for  # noqa: E402
from twinflow.runtime.positions import position_order  # noqa: E402
from twinflow.runtime.store.flow_keys import FlowKeys  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402

EXAMPLES = Path(__file__).parents[1] / "examples"


def pair_doc(seq: int) -> dict:
    return {"id": f"m{seq}", "seq": seq}


def chained_doc(seq: int, lone_every: int = 20) -> dict:
    k, second = divmod(seq, 2)
    if second and k % lone_every == lone_every - 1:  # an order that never gets its payment
        return {"id": f"x{k}", "type": "order", "order_id": -k - 1, "seq": seq}
    kind = "payment" if second else "order"
    return {"id": f"{kind[0]}{k}", "type": kind, "order_id": k, "seq": seq}


class Run:
    def __init__(self, name: str, text: str, document):
        self.name, self.document = name, document
        self.cluster = LocalCluster(tempfile.mkdtemp(prefix="twinflow-bench-"), flow=name, text=text).start(peers=False)
        self.store = FlowStore(self.cluster.redis, FlowKeys(name), "bench")
        self.seq = 0
        self.written: dict[str, float] = {}  # message ID -> uplink write time (s)

    def publish(self, n: int) -> str:
        last = ""
        for i in range(0, n, 5000):
            docs = [self.document(self.seq + j) for j in range(min(5000, n - i))]
            self.seq += len(docs)
            positions = self.store.publish(json.dumps(d).encode() for d in docs)
            for d, p in zip(docs, positions):
                self.written[d["id"]] = int(p.split("-")[0]) / 1000
            last = positions[-1]
        return last

    def processed_past(self, position: str) -> bool:
        mark = self.store.processed_mark()
        return mark is not None and position_order(mark) >= position_order(position)

    def outputs(self) -> dict:
        return self.cluster.outputs()

    def burst(self, n: int) -> float:
        t0 = time.monotonic()
        last = self.publish(n)
        assert wait_for(lambda: self.processed_past(last), 900, 0.05), "burst not processed"
        return n / (time.monotonic() - t0)

    def steady(self, rate: float, seconds: float) -> str:
        start, sent, last = time.monotonic(), 0, ""
        while sent < rate * seconds:
            n = int(rate / 20)
            last = self.publish(n)
            sent += n
            delay = start + sent / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return last

    def latencies(self, since_ms: int) -> tuple[list[float], list[float]]:
        """(output latencies, time-out lateness) of the outputs written after ``since_ms``."""
        lat, late = [], []
        for name, entries in self.outputs().items():
            for e in entries:
                if e.written_ms < since_ms:
                    continue
                members = [self.written[m] for m in e.id.split("+") if m in self.written]
                if name.endswith(".expired"):
                    late.append(e.written_ms / 1000 - e.at)
                elif members:
                    lat.append(e.written_ms / 1000 - max(members))
        return lat, late


def measure(name: str, text: str, document, args) -> dict:
    run = Run(name, text, document)
    try:
        run.cluster.start_peers()
        run.cluster.wait_ready()
        record: dict = {"flow": name}
        record["burst_msgs_per_s"] = round(run.burst(args.messages))
        since = int(time.time() * 1000)
        last = run.steady(args.rate, args.seconds)
        assert wait_for(lambda: run.processed_past(last), 300, 0.05)
        time.sleep(3.0)  # let the last time-outs (2 s) of the steady run fire: a fixed horizon, not a condition
        lat, late = run.latencies(since)
        record.update(rate=args.rate, p50_ms=pct(lat, 0.5), p99_ms=pct(lat, 0.99), outputs=len(lat),
                      timer_p50_ms_load=pct(late, 0.5), timer_p99_ms_load=pct(late, 0.99), timers_load=len(late))
        # Idle: nothing published for 20 s, then a few lone orders whose time-outs fire on an idle peer.
        pids = {n: p.pid for n, p in run.cluster.peers.items() if p.alive()}
        before = {n: cpu_ticks(pid) for n, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(20.0)  # the idle window being measured
        span = time.monotonic() - t0
        record["idle_cpu_pct"] = {n: round(100 * (cpu_ticks(pid) - before[n]) / TICKS / span, 1)
                                  for n, pid in pids.items()}
        if name == "chained":
            since = int(time.time() * 1000)
            for k in range(20):
                run.store.publish([json.dumps({"id": f"idle{k}", "type": "order", "order_id": -10**6 - k,
                                               "seq": run.seq}).encode()])
                run.seq += 1
                time.sleep(0.25)  # spread the due times over 5 s
            time.sleep(3.0)
            _, idle_late = run.latencies(since)
            record.update(timer_p50_ms_idle=pct(idle_late, 0.5), timer_p99_ms_idle=pct(idle_late, 0.99),
                          timers_idle=len(idle_late))
        report = check_outputs(run.outputs(), list(run.written))
        record.update(lost=report.lost, duplicated=report.duplicated)
        return record
    finally:
        run.cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    chained = (EXAMPLES / "cluster-chained.yaml").read_text().replace("timeout: 10 ", "timeout: 2 ")
    records = [measure("pair", (EXAMPLES / "cluster.yaml").read_text(), pair_doc, args),
               measure("chained", chained, chained_doc, args)]
    ratio = records[1]["burst_msgs_per_s"] / records[0]["burst_msgs_per_s"]
    result = {"messages": args.messages, "runs": records, "chained_over_pair": round(ratio, 2)}
    save("chained", result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
