"""The runnable examples in every module's docstrings stay true.

Modules are found by walking the installed packages (``runtime/``, ``cluster/``
and ``chaos/`` install as subpackages of ``twinflow`` from their own folders,
so each is walked from its own path; ``twinflow_dev`` is a package of its own): a new module with examples is tested
without being listed here.
"""

import doctest
import importlib
import inspect
import pkgutil

import pytest

PACKAGES = ("twinflow", "twinflow.runtime", "twinflow.cluster", "twinflow.chaos", "twinflow_dev")


def modules_with_examples() -> list[str]:
    names = set()
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, package + "."):
            if info.name.startswith("twinflow.wire"):  # generated code
                continue
            if ">>> " in inspect.getsource(importlib.import_module(info.name)):
                names.add(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module)
    assert result.failed == 0
    # A module whose examples all need live servers marks them +SKIP; any other must run some.
    assert result.attempted > 0 or "doctest: +SKIP" in inspect.getsource(module)


def test_every_package_is_walked():
    found = modules_with_examples()
    for expected in ("twinflow.runtime.nodes.join", "twinflow.cluster.escalation", "twinflow.chaos.fault_link",
                     "twinflow_dev.guide_blocks"):
        assert expected in found
