"""What a node's Python processes import: the driver's py4j argument converters (PySpark's NumPy
converters answer without importing pyspark.testing.utils, and with it pandas, pyarrow and NumPy,
and alike once NumPy is there); the stream reader's worker builds its Arrow batches without pandas."""

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


READER_WORKER = """
import sys, types
if sys.argv[1] == "reader":
    sys.modules["__main__"].__spec__ = types.SimpleNamespace(name="pyspark.sql.streaming.python_streaming_source_runner")
import twinflow.runtime.spark.source as source
import twinflow.runtime.spark.source  # a second import adds no second finder
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches
rows = [("1-0", b"x", 1), ("1-1", None, None)] * 3
batches = list(records_to_arrow_batches(iter(rows), 4, source.SCHEMA, None))
assert [b.num_rows for b in batches] == [4, 2], batches
assert batches[0].to_pylist()[:2] == [{"position": "1-0", "data": b"x", "size": 1},
                                     {"position": "1-1", "data": None, "size": None}]
print(sum(isinstance(f, source._NoPandas) for f in sys.meta_path), "pandas" in sys.modules)
"""


def test_the_reader_worker_builds_arrow_batches_without_pandas():
    def run(kind: str) -> str:
        done = subprocess.run([sys.executable, "-c", READER_WORKER, kind], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run("reader") == "1 False"
    assert run("other") == "0 True"  # elsewhere pyarrow imports pandas as it does without twinflow
