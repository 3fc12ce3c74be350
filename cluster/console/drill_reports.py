"""Drill results where a drill wrote them, for the console's drills panel.

``twinflow drill ... --json`` writes one JSON line per drill run (its name, seed, messages,
lost, duplicated, out of order, recovery time, passed); a directory of such ``.jsonl``
files (a lab's, or ``chaos/results/``) is what ``twinflow console --reports DIR`` shows,
newest file first.

Under failure: a file that cannot be read, or a line that is not a drill result, is left
out; a missing directory shows no reports.
"""

from __future__ import annotations

import json
from pathlib import Path

FILES_SHOWN = 20
FIELDS = ("drill", "seed", "messages", "lost", "duplicated", "out_of_order", "rto_s", "passed", "hosts")


def drill_reports(directory: Path | None) -> list[dict]:
    """``[{"file", "modified", "runs": [{field: value}]}]``, the newest ``FILES_SHOWN`` files first.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "drills.jsonl").write_text('{"drill": "kill-master", "passed": true, "lost": 0}\\nnot json\\n')
    >>> [(r["file"], r["runs"]) for r in drill_reports(d)]
    [('drills.jsonl', [{'drill': 'kill-master', 'lost': 0, 'passed': True}])]
    """
    if directory is None or not directory.is_dir():
        return []
    found = []
    for path in directory.glob("*.jsonl"):
        try:
            runs = [_run(line) for line in path.read_text().splitlines()]
            modified = path.stat().st_mtime
        except OSError:
            continue
        runs = [r for r in runs if r is not None]
        if runs:
            found.append({"file": path.name, "modified": modified, "runs": runs})
    found.sort(key=lambda f: f["modified"], reverse=True)
    return found[:FILES_SHOWN]


def _run(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or "drill" not in row:
        return None
    return {k: row[k] for k in FIELDS if k in row}
