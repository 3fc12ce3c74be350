"""The member's shape: parts that own their state (cluster/member.py's module doc).

A part's attributes are set only in its own module, through ``self``; another part asks it
(a method) rather than writing into it, and no part reads another's private names. So a reader
can tell from one module what a part holds, and a change to one part cannot break another
through a shared name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parent.parent / "cluster"
PARTS = ("member", "member_state", "member_events", "batch_intake", "master_side", "promotion", "claims",
         "reader_control", "member_timers", "start_position")


def tree(name: str) -> ast.Module:
    return ast.parse((CLUSTER / f"{name}.py").read_text())


def test_the_member_inherits_from_nothing_but_object():
    for node in ast.walk(tree("member")):
        if isinstance(node, ast.ClassDef):
            assert len(node.bases) <= 1, f"{node.name} has {len(node.bases)} bases"


@pytest.mark.parametrize("name", PARTS)
def test_a_part_sets_only_its_own_attributes(name):
    wrong = []
    for node in ast.walk(tree(name)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store) and \
                        not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    wrong.append(f"{name}.py:{t.lineno}: {ast.unparse(t)}")
    assert wrong == []


@pytest.mark.parametrize("name", PARTS)
def test_a_part_reads_no_private_name_of_another(name):
    wrong = [f"{name}.py:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree(name))
             if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
             and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    assert wrong == []
