#!/usr/bin/env bash
# Regenerates the gRPC stubs in twinflow/wire/ from proto/. Never edit the output.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -f twinflow/wire/*_pb2*.py twinflow/wire/*_pb2*.pyi
"$PY" -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/twinflow/wire/*.proto
echo "regenerated: $(ls twinflow/wire/*_pb2*.py* | tr '\n' ' ')"
