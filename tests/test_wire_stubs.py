"""The generated gRPC stubs in twinflow/wire/ are exactly what proto/ generates with the pinned grpcio-tools.

A stub edited by hand, or a .proto changed without `make proto`, fails here.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stubs_match_the_proto_files(tmp_path):
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    assert protos, "no .proto files found"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}", f"--python_out={tmp_path}",
                    f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *protos], check=True)
    generated = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*_pb2*.py*")}
    assert generated, "protoc generated nothing"
    committed = {p.relative_to(ROOT): p.read_bytes() for p in (ROOT / "twinflow" / "wire").glob("*_pb2*.py*")}
    assert sorted(generated) == sorted(committed)
    stale = [str(path) for path, data in generated.items() if committed[path] != data]
    assert not stale, f"regenerate with `make proto`: {stale}"
