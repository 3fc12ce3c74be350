"""The architecture page names every module: each .py file of runtime/, cluster/, chaos/ and
twinflow/ (with testing/ and wire/) and twinflow_dev/ appears, in backticks, in its package's section of
docs/contributing/architecture.md, so the page stays the one complete map of the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "contributing" / "architecture.md"

# The page's section for each package root, and the folders whose modules it lists (a module's
# name there is its path under the section's folder; twinflow/testing/ has a section of its own).
SECTIONS = {"runtime/": ["runtime"], "cluster/": ["cluster"], "chaos/": ["chaos"],
            "twinflow/testing/": ["twinflow/testing"], "twinflow/": ["twinflow"],
            "twinflow_dev/": ["twinflow_dev"]}


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## `([\w/]+)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def named(section: str) -> set[str]:
    return set(re.findall(r"`([\w./]+\.py)`", section))


def modules(folder: str) -> list[str]:
    base = ROOT / folder
    found = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if folder == "twinflow" and rel.startswith("testing/"):
            continue  # its own section
        found.append(rel)
    return found


def missing(text: str) -> list[str]:
    by_section = sections(text)
    out = []
    for title, folders in SECTIONS.items():
        names = named(by_section.get(title, ""))
        out += [f"{folder}/{rel}" for folder in folders for rel in modules(folder) if rel not in names]
    return out


def test_every_module_is_on_the_architecture_page():
    assert set(SECTIONS) <= set(sections(PAGE.read_text()))
    assert missing(PAGE.read_text()) == []


def test_a_module_left_off_the_page_is_caught():
    text = PAGE.read_text().replace("`flow_clock.py`", "the flow's clock")
    assert missing(text) == ["cluster/flow_clock.py"]
