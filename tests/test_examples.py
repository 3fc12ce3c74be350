"""Every example in examples/ replays to exactly its expected output, through `twinflow replay`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted(p.parent for p in (Path(__file__).parents[1] / "examples").glob("*/expected.jsonl"))


def read_jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_every_example_directory_is_replayed():
    # A directory without expected.jsonl would be left out of the test below without a word.
    dirs = sorted(p.parent for p in (Path(__file__).parents[1] / "examples").glob("*/flow.yaml"))
    assert EXAMPLES and dirs == EXAMPLES


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_replays_to_its_expected_output(example):
    args = [sys.executable, "-m", "twinflow.cli", "replay", str(example / "flow.yaml"), str(example / "events.jsonl")]
    until = example / "until"
    if until.exists():
        args += ["--until", until.read_text().strip()]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert read_jsonl(r.stdout) == read_jsonl((example / "expected.jsonl").read_text())
