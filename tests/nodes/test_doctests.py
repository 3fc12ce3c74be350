"""The runnable examples in the pure modules' docstrings stay true."""

import doctest

import pytest

from twinflow.runtime import clock, fields, message, params, replay
from twinflow.runtime.nodes import action, base, sort


@pytest.mark.parametrize("module", [clock, fields, message, params, replay, base, action, sort], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
