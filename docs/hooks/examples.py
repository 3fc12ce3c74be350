"""MkDocs hook: a node page shows its worked examples from examples/ as they are.

A line ``<!-- example: join-and -->`` becomes a section with the example's
description (the comment lines that open its flow.yaml), the command that
replays it, and its files: flow.yaml, events.jsonl, expected.jsonl (what
``twinflow replay`` prints, checked by tests/test_examples.py) and any
handler module beside them. A marker naming a missing example is reported.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.examples")

MARKER = re.compile(r"^<!-- example: ([\w.-]+) -->$", re.M)
LANG = {".yaml": "yaml", ".jsonl": "json", ".py": "python"}


def render(example: Path) -> str:
    name = f"examples/{example.name}"
    flow = (example / "flow.yaml").read_text(encoding="utf-8").splitlines()
    header = []
    while flow and flow[0].startswith("#"):
        header.append(flow.pop(0).lstrip("#").strip())
    while flow and not flow[0].strip():
        flow.pop(0)
    out = [f"### `{name}`", ""]
    if header:
        out += ["\n".join(header), ""]  # a bare "#" line separates paragraphs
    until = example / "until"  # where the example's clock stops, as tests/test_examples.py reads it
    until = f" --until {until.read_text().strip()}" if until.is_file() else ""
    out += ["```sh", f"twinflow replay {name}/flow.yaml {name}/events.jsonl{until}", "```", "",
            "`flow.yaml`:", "", "```yaml", *flow, "```", ""]
    for title, file in (("Events (`events.jsonl`)", "events.jsonl"),
                        ("What leaves, as `twinflow replay` prints it (`expected.jsonl`)", "expected.jsonl")):
        out += [f"{title}:", "", "```json", (example / file).read_text(encoding="utf-8").rstrip("\n"), "```", ""]
    for extra in sorted(p for p in example.iterdir() if p.suffix == ".py"):
        out += [f"`{extra.name}`:", "", f"```{LANG[extra.suffix]}", extra.read_text(encoding="utf-8").rstrip("\n"),
                "```", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    root = Path(config["config_file_path"]).parent / "examples"

    def expand(m: re.Match) -> str:
        example = root / m.group(1)
        if not (example / "flow.yaml").is_file():
            log.warning("%s: no example %s (no examples/%s/flow.yaml)", page.file.src_uri, m.group(1), m.group(1))
            return m.group(0)
        return render(example)

    return MARKER.sub(expand, markdown)
