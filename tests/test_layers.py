"""The import layers written in .importlinter hold: no upward import, no cycle, a pure core
that touches no server, a simulator without Spark, and nothing ``twinflow run`` imports that
reaches the test harness or the development tools (``tests/test_run_imports.py`` checks the
modules a peer process loads).

The package maps runtime/, cluster/ and chaos/ into ``twinflow`` (pyproject's
``package-dir``), which import-linter cannot follow in the editable install;
so the check runs on a plain install of the checkout into a temporary
directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold(tmp_path):
    # A copy of the sources, so that setuptools' build directory is not left in the checkout.
    source, target = tmp_path / "source", tmp_path / "site"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for tree in ("twinflow", "runtime", "cluster", "chaos", "twinflow_dev"):
        shutil.copytree(ROOT / tree, source / tree, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert install.returncode == 0, install.stderr
    assert (target / "twinflow" / "chaos" / "sim").is_dir()  # the mapped packages are there
    lint = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), str(ROOT / ".importlinter")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(target)})
    assert lint.returncode == 0, lint.stdout[-4000:] + lint.stderr[-2000:]
    assert "0 broken" in lint.stdout
