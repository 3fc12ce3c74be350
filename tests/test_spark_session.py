"""The driver's py4j argument converters: PySpark's NumPy converters answer without importing
pyspark.testing.utils (and with it pandas, pyarrow and NumPy), and alike once NumPy is there."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import datetime, sys
from twinflow.runtime.spark.session import _numpy_converters_without_imports
from py4j import protocol
_numpy_converters_without_imports()
_numpy_converters_without_imports()  # idempotent
for arg in (1, "s", b"b", [1, 2], {"k": 1}, datetime.date(2024, 1, 1), None):
    for converter in protocol.INPUT_CONVERTER:
        converter.can_convert(arg)
heavy = sorted(m for m in ("pandas", "pyarrow", "numpy", "pyspark.testing.utils") if m in sys.modules)
assert not heavy, heavy
import numpy as np
numpy_converters = {type(c).__name__: c for c in protocol.INPUT_CONVERTER if type(c).__name__.startswith("Numpy")}
scalar, array = numpy_converters["NumpyScalarConverter"], numpy_converters["NumpyArrayConverter"]
assert scalar.can_convert(np.int64(3)) and not scalar.can_convert(3)
assert array.can_convert(np.arange(3)) and not array.can_convert(np.zeros((2, 2))) and not array.can_convert([1])
print("ok")
"""


def test_numpy_converters_import_nothing_and_still_convert():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
