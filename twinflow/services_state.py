"""The addresses of the local servers that ``twinflow services up`` recorded, read from its state file.

``twinflow run`` and the operator commands fall back to these when no address is given by a
flag or the environment (:func:`twinflow.cli_common._address`). Reading them takes the
standard library alone: nothing that starts or stops a server (:mod:`twinflow.testing`) is
imported on a peer's path.

>>> import json, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "services.json"
>>> _ = path.write_text(json.dumps({"servers": [{"name": "redis", "port": 40211},
...                                             {"name": "zookeeper", "port": 40213}]}))
>>> recorded = RecordedServices.load(path)
>>> recorded.redis_url, recorded.zk_hosts
('redis://127.0.0.1:40211/0', '127.0.0.1:40213')

Under failure: a state file that cannot be parsed raises ``ValueError`` (``json``'s); a server
the file does not list has no address (``None``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

SERVICES_STATE = Path(".twinflow") / "services.json"


def redis_url(port: int) -> str:
    """The URL of a local Redis on ``port`` (database 0)."""
    return f"redis://127.0.0.1:{port}/0"


def zk_hosts(port: int) -> str:
    """The connection string of a local ZooKeeper on ``port``."""
    return f"127.0.0.1:{port}"


@dataclass(frozen=True)
class RecordedServices:
    """The ports of the servers a state file lists, by name (``redis``, ``zookeeper``)."""

    ports: dict[str, int]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RecordedServices":
        raw = json.loads(Path(path).read_text())
        return cls({s["name"]: int(s["port"]) for s in raw.get("servers", [])})

    @property
    def redis_url(self) -> str | None:
        return redis_url(self.ports["redis"]) if "redis" in self.ports else None

    @property
    def zk_hosts(self) -> str | None:
        return zk_hosts(self.ports["zookeeper"]) if "zookeeper" in self.ports else None
