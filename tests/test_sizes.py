"""Sizes a reader can take in: every module of the code is at most 500 lines (the tests are not
counted), and the Performance page is at most 300, its topics on pages of their own
(docs/performance/). A module that grows past the limit is split by concern; the page's
figures move to a topic's page."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 500
PERFORMANCE_LINES = 300


def code_modules() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, timeout=30)
    names = ([n for n in out.stdout.decode().split("\0") if n] if out.returncode == 0 else
             [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py") if ".venv" not in p.parts])
    return [ROOT / n for n in names if not n.startswith("tests/") and (ROOT / n).is_file()]


def too_long(paths: list[Path], limit: int) -> list[str]:
    lines = {p: len(p.read_text(errors="replace").splitlines()) for p in paths}
    return [f"{p.relative_to(ROOT)}: {n} lines" for p, n in sorted(lines.items()) if n > limit]


def test_every_module_is_at_most_500_lines():
    modules = code_modules()
    assert ROOT / "cluster" / "peer.py" in modules and ROOT / "twinflow_dev" / "lab.py" in modules
    assert too_long(modules, MODULE_LINES) == []


def test_the_performance_page_is_at_most_300_lines():
    assert too_long([ROOT / "docs" / "performance.md"], PERFORMANCE_LINES) == []
    assert {p.name for p in (ROOT / "docs" / "performance").glob("*.md")} >= {"throughput.md", "drills.md"}


def test_a_long_file_is_caught():
    long = ROOT / "docs" / "performance.md"
    assert too_long([long], 10) == [f"docs/performance.md: {len(long.read_text().splitlines())} lines"]
