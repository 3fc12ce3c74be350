"""The guide lab's parts that need no network namespace: its ``systemctl`` finds the unit a
machine has (the one the guide installed, else the package's) and refuses what it cannot run;
its check finds a file root reads that the service user could change. (The lab itself runs in
`twinflow drill guide-all --hosts`: docs/performance/drills.md.)"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from twinflow_dev import guide_lab
from twinflow_dev.guide_blocks import GuideError
from twinflow_dev.guide_hosts import HOSTS
from twinflow_dev.guide_lab import GuideLab

REPO = Path(__file__).parents[1]


@pytest.fixture
def lab(tmp_path) -> GuideLab:
    made = GuideLab(tmp_path / "lab")
    for name, (octet, _) in HOSTS.items():
        made.state.add_host(name, octet)
    for name in HOSTS:
        (Path(made.host(name).root) / "etc/systemd/system").mkdir(parents=True)
    return made


def test_systemctl_finds_the_installed_unit_before_the_packages_and_refuses_what_it_cannot_run(lab):
    root = Path(lab.host("host-a").root)
    (root / "etc/systemd/system/twinflow-zookeeper.service").write_text(
        (REPO / "deploy/systemd/twinflow-zookeeper.service").read_text())
    unit, instance = lab._unit("host-a", "twinflow-zookeeper")
    assert (unit.user, unit.group, instance) == ("zookeeper", "zookeeper", "")
    (root / "etc/systemd/system/twinflow-peer@.service").write_text(
        (REPO / "deploy/systemd/twinflow-peer@.service").read_text())
    unit, instance = lab._unit("host-a", "twinflow-peer@peer-a")
    assert (unit.user, instance) == ("twinflow", "peer-a")
    with pytest.raises(GuideError, match="host-b has no unit twinflow-zookeeper.service"):
        lab._unit("host-b", "twinflow-zookeeper")
    lab.systemctl("host-a", ["daemon-reload"])  # nothing to do
    with pytest.raises(GuideError, match="the lab runs daemon-reload, and enable, disable, start, stop, restart"):
        lab.systemctl("host-a", ["reload", "twinflow-zookeeper"])
    if Path("/lib/systemd/system/redis-server.service").exists():  # Debian's, as the guide uses it
        unit, _ = lab._unit("host-a", "redis-server")
        assert unit.user == "redis" and unit.type == "notify"
        assert unit.start_argv("", {})[:2] == ["/usr/bin/redis-server", "/etc/redis/redis.conf"]


def test_enable_and_disable_are_remembered_and_a_peer_unit_adds_or_removes_the_peer(lab, monkeypatch):
    root = Path(lab.host("host-d").root)
    (root / "etc/systemd/system/twinflow-peer@.service").write_text(
        (REPO / "deploy/systemd/twinflow-peer@.service").read_text())
    monkeypatch.setattr(GuideLab, "save", lambda self: None)
    assert lab.peer_ids() == ("peer-a", "peer-b")
    lab.systemctl("host-d", ["enable", "twinflow-peer@peer-c"])  # not --now: nothing started
    assert lab.peer_ids() == ("peer-a", "peer-b", "peer-c")
    assert lab.state.info["enabled"]["host-d"] == ["twinflow-peer@peer-c"]
    lab.systemctl("host-d", ["disable", "twinflow-peer@peer-c"])
    assert lab.peer_ids() == ("peer-a", "peer-b") and lab.state.info["enabled"]["host-d"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")
def test_a_file_root_reads_that_the_service_user_could_change_is_named(lab, monkeypatch):
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(guide_lab, "USER", "nobody")
    etc = Path(lab.host("host-a").root) / "etc/twinflow"
    etc.mkdir(parents=True)
    fine = etc / "peer-a.env"
    fine.write_text("FLOW=/etc/twinflow/flow.yaml\n")
    os.chown(fine, 0, nobody.pw_gid)
    fine.chmod(0o640)  # root's, read by the service's group: as the guide makes it
    assert lab.ownership_problems() == []
    fine.chmod(0o660)  # the group may write it: root would source what the service wrote
    owned = etc / "flow.yaml"
    owned.write_text("flow: x\n")
    os.chown(owned, nobody.pw_uid, nobody.pw_gid)
    problems = lab.ownership_problems()
    assert len(problems) == 2
    assert any("host-a: /etc/twinflow/peer-a.env" in p and "mode 0660" in p for p in problems)
    assert any(f"host-a: /etc/twinflow/flow.yaml is uid {nobody.pw_uid}" in p for p in problems)
