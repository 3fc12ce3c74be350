"""The deployment guide says what the lab runs: its server settings are the lab's, its unit is the shipped one."""

import re
from pathlib import Path

from twinflow.testing.servers import ZOO_CFG, redis_argv
from twinflow.testing.redis_ha import SENTINEL_CONF

ROOT = Path(__file__).parents[1]
GUIDE = (ROOT / "docs" / "operations" / "deploy.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE, re.S)


def settings(text: str) -> set[str]:
    """Lines that set something, placeholders (``<...>``) and comments left out."""
    return {line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith("#") and "<" not in line}


def test_the_guides_zookeeper_settings_are_the_labs():
    guide = next(b for b in blocks("text") if "tickTime" in b)
    lab = ZOO_CFG.format(data_dir="/var/lib/zookeeper", port=2181, address="x")
    assert {s for s in settings(guide) if not s.startswith("server.")} <= settings(lab)


def test_the_guides_sentinel_settings_are_the_labs():
    guide = next(b for b in blocks("text") if "sentinel monitor" in b)
    lab = SENTINEL_CONF.format(port=26379, bind="x", dir="d", service="twinflow", primary_host="host-a.example",
                               primary=6379, quorum=2, down_after_ms=1000, failover_timeout_ms=4000)
    # Where Sentinel keeps its files is each machine's own (the lab's: each Sentinel's directory).
    assert {s for s in settings(guide) if not s.startswith(("sentinel auth-pass", "dir "))} <= settings(lab)


def test_the_guides_redis_settings_are_those_every_lab_redis_runs_with():
    guide = next(b for b in blocks("text") if "maxmemory-policy" in b)
    argv = " ".join(redis_argv(Path("/d"), port=6379))
    for line in settings(guide):
        key, value = line.split(" ", 1)
        if key in ("appendonly", "appendfsync", "maxmemory-policy", "protected-mode"):
            assert f"--{key} {value}" in argv


def test_the_guide_shows_the_shipped_unit_and_environment_file():
    for path in ("deploy/systemd/twinflow-peer@.service", "deploy/systemd/peer.env.example"):
        assert f'--8<-- "{path}"' in GUIDE
        assert (ROOT / path).exists()
