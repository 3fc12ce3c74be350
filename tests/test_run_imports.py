"""A peer loads none of the tooling: ``twinflow run``, through the command's own path (the flow
file, the addresses from the state file ``twinflow services up`` wrote, the gRPC settings, the
peer's configuration), and every module of the cluster and the runtime leave no module of the
test harness (``twinflow.testing``), the development tools (``twinflow_dev``: the lab, the
guide runner, the benches, the demo) or the chaos tools in ``sys.modules``.

Each check runs in a process of its own, so that nothing this test session imported counts.
The imports a function makes only when called are checked without running them by the
``run`` contract of ``.importlinter`` (``tests/test_layers.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOW = ROOT / "examples" / "cluster-chained.yaml"
TOOLING = ("twinflow_dev", "twinflow.testing", "twinflow.chaos")

SCRIPT = """
import json, pkgutil, sys, importlib

import twinflow.cli
import twinflow.cluster.peer as peer_module

seen = {}

class Started(Exception):
    pass

def for_flow(graph, cfg, parts=None):
    seen.update(redis=cfg.redis_url, zk=cfg.zk_hosts)
    raise Started

peer_module.Peer.for_flow = staticmethod(for_flow)
try:
    twinflow.cli.main(["run", sys.argv[1], "--peer-id", "peer-a"])
except Started:
    pass
import twinflow.cluster, twinflow.runtime
for package in (twinflow.cluster, twinflow.runtime):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
for extra in sys.argv[2:]:
    importlib.import_module(extra)
print(json.dumps({"seen": seen, "modules": sorted(sys.modules)}))
"""


def run_imports(tmp_path: Path, *extra: str) -> dict:
    """What a ``twinflow run`` process has loaded once the peer would start, with every module of
    the cluster and the runtime imported too (and ``extra``, for the check that fails)."""
    state = tmp_path / ".twinflow" / "services.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"base_dir": str(tmp_path), "owns_base_dir": False, "servers": [
        {"name": "redis", "port": 40211, "pid": 1, "log": "redis.log"},
        {"name": "zookeeper", "port": 40213, "pid": 2, "log": "zk.log"}]}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GRPC_ENABLE_FORK_SUPPORT": "false"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(FLOW), *extra], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def tooling(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == t or m.startswith(t + ".") for t in TOOLING)]


def test_twinflow_run_and_the_peer_import_no_tooling(tmp_path):
    out = run_imports(tmp_path)
    # The command got as far as the peer, with the addresses the state file records.
    assert out["seen"] == {"redis": "redis://127.0.0.1:40211/0", "zk": "127.0.0.1:40213"}
    assert "twinflow.cluster.peer" in out["modules"] and "twinflow.runtime.spark.stream" in out["modules"]
    assert tooling(out["modules"]) == []


def test_a_tooling_module_on_the_path_is_caught(tmp_path):
    out = run_imports(tmp_path, "twinflow_dev.lab")
    assert "twinflow_dev.lab" in tooling(out["modules"])
    assert "twinflow.testing.servers" in tooling(out["modules"])  # the lab's own imports count too
