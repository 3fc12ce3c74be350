"""What the lab tests share: a namespace prefix of the test process's own."""

from __future__ import annotations

import os

import pytest

from twinflow_dev.lab_network import LabUnavailable, check_usable


def lab_prefix(tag: str) -> str:
    """``<tag><pid>-``, after checking that this machine can make lab namespaces (root, a usable
    ``ip netns``); the test is skipped, with the reason, where it cannot. The PID keeps a test on
    another xdist worker from meeting them."""
    prefix = f"{tag}{os.getpid()}-"
    try:
        check_usable(prefix)
    except LabUnavailable as exc:
        pytest.skip(f"no lab on this machine: {exc}")
    return prefix
