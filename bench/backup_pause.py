"""How long ``twinflow backup`` holds a Redis's writes, and how long a restore's keys take to put back.

A real redis-server on loopback (appendonly off). The chained flow
(``examples/cluster-chained.yaml``) is filled by real master steps (``MasterFlow.run`` and
``FlowStore.commit``, 500 messages a step), N messages: about N ID-cache keys, the history's
hash, the uplink and the sink. Then, while a writer (a process of its own) sets a key every
millisecond and records how long each ``SET`` took:

- ``pause_ms``: the backup's copy (``cluster/flow_backup.take_backup``, the command's own code,
  to a file), as it measures its pause: from asking for ``CLIENT PAUSE`` to the answer that
  ended it; ``write_wait_ms``: the writer's longest ``SET`` meanwhile;
- the same with ``others`` keys of another flow in the Redis beside it (``SCAN`` walks them);
- ``restore_s``: the keys put back (``key_copy.restore_keys``) into the emptied Redis.

Run: ``.venv/bin/python bench/backup_pause.py [N] [OTHERS]`` (default 50000 and 500000);
prints one JSON line and appends it to ``bench/results/backup_pause.jsonl``.
"""

from __future__ import annotations

import json
import sys
import signal
import subprocess
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))
from common import save, scratch_redis  # noqa: E402
from redis_sizing import CHAINED, run_steps  # noqa: E402

from twinflow.cluster.flow_backup import take_backup  # noqa: E402
from twinflow.runtime.backup_file import read_backup  # noqa: E402
from twinflow.runtime.flowgraph import load_graph  # noqa: E402
from twinflow.runtime.store.flow_keys import FlowKeys  # noqa: E402
from twinflow.runtime.store.flow_store import FlowStore  # noqa: E402
from twinflow.runtime.store.key_copy import restore_keys  # noqa: E402
from twinflow.testing.messages import order_or_payment  # noqa: E402

FLOW = "size-a"  # run_steps's keys (FlowKeys(flow)): the chained flow's uplink and sink names


def backup_while_writing(r: redis.Redis, out: Path) -> dict:
    graph = load_graph(CHAINED)
    store = FlowStore(r, FlowKeys(FLOW), "bench")  # as run_steps wrote it
    # The writer is a process of its own, as a flow's peers are: a thread here would take turns
    # with the copy for the interpreter and stretch it.
    port = r.connection_pool.connection_kwargs["port"]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(port)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    try:
        header = take_backup(graph, [store], out, bound_ms=60_000)
        time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGTERM)
        longest, _ = writer.communicate(timeout=10)
    shard = header["shards"][0]
    return {"keys": shard["keys"], "pause_ms": shard["pause_ms"], "write_wait_ms": float(longest),
            "file_bytes": out.stat().st_size}


# Set a key every millisecond until SIGTERM; then print the longest SET, in ms.
WRITER = """
import signal, sys, time, redis
w, longest, stop = redis.Redis(port=int(sys.argv[1])), 0.0, []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while not stop:
    began = time.monotonic()
    w.set("bench:writer", began)
    longest = max(longest, time.monotonic() - began)
    time.sleep(0.001)
print(round(longest * 1000, 1))
"""


def measure(r: redis.Redis, n: int, others: int, out: Path) -> dict:
    r.flushall()
    run_steps(r, FLOW, [order_or_payment(i) for i in range(n)])
    result = {"n": n, "alone": backup_while_writing(r, out)}
    pipe = r.pipeline(transaction=False)
    for i in range(others):
        pipe.set(f"tf:{{size-other}}:id:o{i:07d}", 1, ex=86400)
        if len(pipe) >= 10_000:
            pipe.execute()
    pipe.execute()
    result["beside"] = {"others": others, **backup_while_writing(r, out)}
    _, records = read_backup(out)
    r.flushall()
    began = time.monotonic()
    restore_keys(r, records)
    result["restore_s"] = round(time.monotonic() - began, 2)
    return result


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    others = int(sys.argv[2]) if len(sys.argv) > 2 else 500_000
    with scratch_redis("twinflow-backup-") as (port, d):
        result = measure(redis.Redis(port=port), n, others, d / "flow.tfb")
    print(json.dumps(result))
    save("backup_pause", result)


if __name__ == "__main__":
    main()
