"""What a node installs: the wheel holds the runtime and the importable tools, no drill results,
benchmark data, documentation or tests; the version is one number, printed by ``twinflow --version``;
a node runs without the chaos extra's dependencies."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import twinflow

ROOT = Path(__file__).parents[1]

# Where each package's modules live in the repository (pyproject.toml's package-dir).
PACKAGES = {
    "twinflow": "twinflow", "twinflow/wire": "twinflow/wire", "twinflow/testing": "twinflow/testing",
    "twinflow/runtime": "runtime", "twinflow/runtime/nodes": "runtime/nodes",
    "twinflow/runtime/nodes/sort": "runtime/nodes/sort", "twinflow/runtime/store": "runtime/store",
    "twinflow/runtime/spark": "runtime/spark",
    "twinflow/cluster": "cluster", "twinflow/cluster/console": "cluster/console", "twinflow/chaos": "chaos", "twinflow/chaos/sim": "chaos/sim",
    # The development tools, a top-level package of their own that a peer never imports.
    "twinflow_dev": "twinflow_dev",
}
# The only files beside the modules: the checkpoint file system's Java source and the stubs' type hints.
DATA = {"twinflow/runtime/spark/NoForkLocalFileSystem.java", "twinflow/wire/twinflow_pb2.pyi",
        # The console's page, its script and its style (cluster/console/static/).
        *(f"twinflow/cluster/console/static/{n}" for n in ("index.html", "console.js", "console.css"))}


def tracked_copy(dest: Path) -> Path:
    """The repository's tracked files (what a clone holds), copied to ``dest``."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=30)
    names = ([n for n in out.stdout.decode().split("\0") if n] if out.returncode == 0 else
             [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts
              and ".git" not in p.parts])
    for name in names:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def build_wheel(tmp_path: Path) -> Path:
    src = tracked_copy(tmp_path / "src")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    (wheel,) = (tmp_path / "dist").glob("twinflow-*.whl")
    return wheel


def test_the_wheel_holds_the_runtime_and_no_data(tmp_path):
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"twinflow-{twinflow.__version__}-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    files = [n for n in names if ".dist-info/" not in n]
    # Every file is a module of the expected packages or one of the named data files.
    assert {n.rsplit("/", 1)[0] for n in files if n not in DATA} == set(PACKAGES)
    assert [n for n in files if not n.endswith(".py") and n not in DATA] == []
    assert [n for n in names if re.search(r"(^|/)results/|RESULTS|\.jsonl$|\.md$|\.png$|(^|/)(tests|docs|bench)/", n)] == []
    # And every module of the repository's packages is in it: the runtime is whole.
    modules = {f"{pkg}/{p.name}" for pkg, where in PACKAGES.items() for p in (ROOT / where).glob("*.py")}
    assert modules <= set(files), sorted(modules - set(files))


def test_the_version_is_printed_by_the_command():
    r = subprocess.run([sys.executable, "-m", "twinflow.cli", "--version"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"twinflow {twinflow.__version__}" == "twinflow 0.2.0"


def test_the_version_has_one_source_and_a_changelog_entry():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "twinflow.__version__"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(twinflow.__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)


# The chaos extra's dependencies: a node's install does not have them.
CHAOS_ONLY = ("toxiproxy", "fakeredis", "matplotlib", "lupa")


def test_a_node_runs_without_the_chaos_extra():
    # Each chaos-only package refused at import: the command line, `twinflow run --help` and the
    # peer's modules must still load.
    code = f"""
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {CHAOS_ONLY!r}:
            raise ImportError('not installed: ' + name)
sys.meta_path.insert(0, Refuse())
import twinflow.cli, twinflow.cluster.peer, twinflow.client
try:
    twinflow.cli.main(['run', '--help'])
except SystemExit as e:
    assert e.code == 0, e.code
loaded = sorted(m for m in sys.modules if m.split('.')[0] in {CHAOS_ONLY!r} or m.startswith('twinflow.chaos'))
print('loaded:', loaded)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "usage: twinflow run" in r.stdout
    assert r.stdout.strip().endswith("loaded: []")
