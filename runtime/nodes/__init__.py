"""The nodes, one module per kind, each pure logic (see ``base``); ``builder(kind)`` finds one."""

from __future__ import annotations

import importlib
from typing import Callable

KINDS = ("join", "history", "sort", "resequence", "sequence", "aggregate", "action")


def builder(kind: str) -> Callable:
    """The ``build(name, params)`` function of node kind ``kind``."""
    if kind not in KINDS:
        raise KeyError(kind)
    return importlib.import_module(f"{__name__}.{kind}").build
