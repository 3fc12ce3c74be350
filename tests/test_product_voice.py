"""The repository speaks of the product and its users: no text says who worked on it or in which
sitting of work something was done (the history is in git). Every tracked text file is read, and
every tracked file's name; a hit is reported as file:line with the words found.

"Session" is a word of the product (a ZooKeeper session, ``MasterSession``, a SparkSession, "a
session's expiry", "the same session", "another session"), so only phrases that can mean a sitting
of work are matched, never the bare word.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]

ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
           r"\d+(?:st|nd|rd|th))")
# What says when or by whom something was done, in prose, code comments and docstrings.
SITTING = [
    # a sitting of work: this, a later or the third such session, or "session 4"
    rf"\b(?:this|previous|last|next|earlier|later|current|{ORDINAL})\s+(?:working\s+|work\s+)?session\b(?!['’]s\b|\s+(?:has|had|is|was|expires?|expired|ends?|ended|times?\s+out)\b)",
    r"\bin\s+(?:a|the)\s+(?:later|previous|next|earlier|former|following)\s+session\b",
    r"\bsession\s+(?:of\s+work|\d+)\b",
    r"\bsittings?\b",
    r"\b(?:working|work)\s+session\b",
    r"\b(?:in|during|before|after|since|of)\s+this\s+work\b",
    # who: the people or programs that worked on it
    r"\b(?:I|we)\s+(?:did|tried|measured|ran|found|fixed|changed|added|wrote|made|noticed|decided|removed)\b",
    r"\bmy\s+\w",
    r"\b(?:claude|anthropic|chatgpt|openai|copilot)\b",
    r"\b(?:ai|coding|llm|language[- ]model)[- ](?:assistant|agent|helper)s?\b",
    r"\b(?:the|a|an|this)\s+(?:helper|agent|assistant)\s+(?:session|sitting|wrote|did|made|worked|found|ran)\b",
]
# In the raw result lines (JSON the tools wrote, servers' logs quoted in them) only the sitting
# phrases apply: a Redis log line says "my new replication IDs" of itself.
SITTING_IN_DATA = SITTING[:6]
# A file named for when or in which sitting it was made: a date, a sitting.
NAME = [r"(?:19|20)\d\d[-_]?(?:0[1-9]|1[0-2])[-_]?(?:[0-2]\d|3[01])",
        rf"(?:{ORDINAL}|previous|last|next|this)[-_]session", r"sitting", r"session[-_]?\d"]

TEXT = (".md", ".py", ".pyi", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini", ".proto", ".java",
        ".lua", ".service", ".example")
TEXT_NAMES = ("Makefile", ".importlinter", "run", ".gitignore")
# The site's copy of Mermaid is a third party's minified code, not this repository's text; this
# file names the phrases in order to find them.
NOT_OURS = ("docs/assets/javascripts/mermaid.min.js", "tests/test_product_voice.py")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=30)
    if out.returncode != 0:  # not a git checkout: every file there
        return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                if p.is_file() and not {".venv", ".git", "__pycache__"} & set(p.parts)]
    return [n for n in out.stdout.decode().split("\0") if n]


def hits_in(name: str, text: str, patterns: list[str]) -> list[str]:
    """One hit per line that says it, with every phrase found there."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        words = [m.group(0) for pattern in patterns for m in re.finditer(pattern, line, re.I)]
        if words:
            found.append(f"{name}:{number}: {', '.join(map(repr, words))}")
    return found


def hits(names: list[str]) -> list[str]:
    found = []
    for name in names:
        found += [f"{name}: file name {m.group(0)!r}" for p in NAME for m in re.finditer(p, name, re.I)]
        path = ROOT / name
        if name in NOT_OURS or path.is_symlink() or not path.is_file():
            continue
        if name.endswith(".jsonl"):
            found += hits_in(name, path.read_text(errors="replace"), SITTING_IN_DATA)
        elif name.endswith(TEXT) or Path(name).name in TEXT_NAMES:
            found += hits_in(name, path.read_text(errors="replace"), SITTING)
    return found


def test_no_text_says_who_worked_on_it_or_in_which_sitting():
    found = hits(tracked())
    assert found == [], "\n".join(found)


def test_the_product_word_session_is_not_a_hit():
    product = ("The worker's election fires when the master's ZooKeeper session expires (2 s).\n"
               "A MasterSession runs the batches; the same session commits; it belongs to another session.\n"
               "Build this SparkSession; the session's expiry; session_timeout: 2\n"
               "the probe vanishing tells the parent that this session has expired")
    assert hits_in("x.md", product, SITTING) == []


def test_sitting_words_are_caught(tmp_path):
    # The word is joined in, so that this file's own text holds none of the phrases it tests.
    s = "session"
    text = (f"Measured in this {s}.\nDone in a later {s}.\nThe third {s} moved it.\n"
            "We measured it again.\nAs I did before.\nWritten by Claude.\nThe result of the sitting.\n"
            "That was not done in this work.")
    assert len(hits_in("x.md", text, SITTING)) == 8
    assert [h.split(": file name ")[1] for h in hits(["chaos/results/drills-2026-11-27.jsonl",
                                                      f"chaos/results/drills-third-{s}.jsonl"])] \
        == ["'2026-11-27'", "'third-session'"]
