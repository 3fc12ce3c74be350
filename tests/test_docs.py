"""The documentation: the site builds without a warning, the front page stays short, the
worked examples on its pages do what the pages say, and the repository keeps its
documentation inside itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from twinflow.runtime.flowgraph import parse_graph
from twinflow.runtime.nodes import KINDS
from twinflow.runtime.replay import replay

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def test_the_site_builds_with_strict_checks(tmp_path):
    # --strict: a broken link or anchor, a missing example, a CLI page that cannot be
    # rendered from the parser or a docstring mkdocstrings cannot read fails the build.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-6000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--worker-pace-ms" in cli and "cli-reference" not in cli  # rendered from the parser, marker replaced
    api = (tmp_path / "site" / "reference" / "client" / "index.html").read_text()
    assert "EscalationClient" in api and "retry_unavailable" in api  # from the docstrings
    assert_offline(tmp_path / "site")


# A script or a stylesheet the browser would fetch from elsewhere: <script src="http...">,
# <link href="http..."> (web fonts, a CDN's copy of a library).
FETCHED = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=[\"']?(?:https?:)?//[^\s\"'>]+", re.I)


def assert_offline(site: Path) -> None:
    """The site works without a network: no page loads a script or a stylesheet from another host,
    the diagrams' Mermaid is the site's own copy, and the pages that draw diagrams load it."""
    pages = list(site.rglob("*.html"))
    assert pages
    fetched = [f"{p.relative_to(site)}: {m.group(0)}" for p in pages for m in FETCHED.finditer(p.read_text())]
    assert fetched == []
    mermaid = site / "assets" / "javascripts" / "mermaid.min.js"
    assert mermaid.stat().st_size > 1_000_000 and b"mermaid" in mermaid.read_bytes()[:2000]
    drawn = {p.relative_to(site).as_posix(): p.read_text() for p in pages if '<pre class="mermaid">' in p.read_text()}
    assert {"concepts/how-it-works/index.html", "contributing/architecture/index.html"} <= set(drawn)
    for page in drawn.values():
        assert re.search(r'<script src="[./]*assets/javascripts/mermaid\.min\.js"', page)
    # The theme fetches Mermaid from a CDN only when no `mermaid` is on the page (its bundle says so).
    bundle = next((site / "assets" / "javascripts").glob("bundle.*.min.js")).read_text()
    assert 'typeof mermaid=="undefined"' in bundle


def test_a_page_that_fetches_a_script_is_caught(tmp_path):
    (tmp_path / "index.html").write_text('<script src="https://unpkg.com/mermaid@11/dist/mermaid.min.js"></script>')
    try:
        assert_offline(tmp_path)
    except AssertionError as e:
        assert "unpkg.com" in str(e)
    else:
        raise AssertionError("a page loading a script from a CDN passed")


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) < 200


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, timeout=30)
    if out.returncode != 0:  # not a git checkout: every file there
        return [p for pattern in patterns for p in ROOT.rglob(pattern) if ".venv" not in p.parts]
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def test_no_file_points_outside_the_repository_for_its_documentation():
    # The promises, the glossary and the node semantics are written down here; nothing may
    # send a reader to a directory beside the repository instead.
    outside = ["../" + "shared", "/work/" + "shared", "numbered as " + "there"]
    found = [f"{path.relative_to(ROOT)}: {needle}" for path in tracked("*.md", "*.py", "*.yaml")
             if path.is_file() for needle in outside if needle in path.read_text(errors="replace")]
    assert found == []


def test_every_node_kind_has_a_page_and_every_example_is_shown():
    pages = {p.stem for p in (DOCS / "reference" / "nodes").glob("*.md")}
    assert set(KINDS) <= pages
    shown = set(re.findall(r"^<!-- example: ([\w.-]+) -->$",
                           "\n".join(p.read_text() for p in (DOCS / "reference" / "nodes").glob("*.md")), re.M))
    examples = {p.parent.name for p in (ROOT / "examples").glob("*/flow.yaml")}
    assert examples == shown


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.M | re.S)


def test_the_first_flow_replays_as_the_page_shows():
    page = DOCS / "getting-started" / "first-flow.md"
    flow = blocks(page, "yaml")[0]
    events, expected = blocks(page, "json")[:2]
    got = list(replay(parse_graph(flow), events.splitlines()))
    assert got == [json.loads(line) for line in expected.splitlines()]
