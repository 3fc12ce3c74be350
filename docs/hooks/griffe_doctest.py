"""Griffe extension for the API pages: docstrings written for doctest and Sphinx, shown as Markdown.

The docstrings in twinflow are written for Python's doctest (which the suite
runs, tests/test_doctests.py) and use Sphinx's cross-reference roles. Markdown
has neither, so before mkdocstrings renders a docstring this extension fences
each doctest example (a run of lines from one starting with ``>>>`` to the
next blank line) as a ``pycon`` block, and turns a role such as
``:class:`~twinflow.client.Client``` into code (`Client`). The docstrings in
the source are unchanged.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")


def fence_doctests(text: str) -> str:
    out, block = [], []
    for line in text.splitlines() + [""]:
        if block and line.strip():
            block.append(line)
            continue
        if block:
            out += ["```pycon", *block, "```"]
            block = []
        if line.lstrip().startswith(">>>"):
            block.append(line)
        else:
            out.append(line)
    return "\n".join(out[:-1])  # the blank line added above


def markdown(text: str) -> str:
    text = ROLE.sub(lambda m: f"`{m.group(1).rpartition('.')[2] if '~' in m.group(0) else m.group(1)}`", text)
    return fence_doctests(text) if ">>>" in text else text


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring:
            obj.docstring.value = markdown(obj.docstring.value)
