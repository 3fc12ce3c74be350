"""The deployment guide's blocks stay runnable by its lab: every annotation parses, names hosts the
guide has, fills every placeholder, and each section the guide's drills run has its blocks.
(The drills themselves run the blocks: `twinflow drill guide-all --hosts`.)"""

from __future__ import annotations

import shlex

import pytest

from twinflow.testing.guide_blocks import ROOTED, GuideError, GuideHost, parse_guide, read_guide
from twinflow.testing.guide_lab import HOSTS, SERVER_NAMES

SECRETS = {"password": "pw", "zookeeper password": "zk-pw"}


def hosts() -> dict[str, GuideHost]:
    return {name: GuideHost(name, f"10.0.0.{octet}", i + 1, peer, f"/lab/{name}")
            for i, (name, (octet, peer)) in enumerate(HOSTS.items())}


def test_every_block_runs_on_hosts_the_guide_has_with_every_placeholder_filled():
    blocks, machines = read_guide(), hosts()
    assert len(blocks) > 40
    for b in blocks:
        assert set(b.hosts) <= set(HOSTS), (b.line, b.hosts)
        for name in b.hosts:
            host = machines[name]
            text = host.as_peer(b.text) if "as-peer" in b.flags else b.text
            filled = host.fill(text, SECRETS)
            assert "<this machine" not in filled
            if b.kind in ("file", "append"):
                assert host.path(b.path).is_relative_to(host.root)
            if b.kind == "copy":
                for line in b.lines():
                    host.path(line)  # a host's own file, or GuideError
            if b.kind == "serve":
                for line in b.lines():
                    assert any(marker in line for marker, _ in SERVER_NAMES), line
            for line in filled.splitlines() if b.kind in ("run", "install") else []:
                words = shlex.split(line.strip()) if line.strip() and not line.strip().startswith("#") else [""]
                if words[0] == "systemctl":  # what the lab's systemctl runs
                    assert words[1] in ("daemon-reload", "enable", "start", "stop", "restart"), line


def test_a_block_for_peer_a_reads_as_peer_b_on_host_b_and_is_refused_where_no_peer_runs():
    block = next(b for b in read_guide() if "as-peer" in b.flags and "systemctl enable" in b.text)
    machines = hosts()
    text = machines["host-b"].as_peer(block.text)
    assert "twinflow-peer@peer-b" in text and "peer-a" not in text and "ADVERTISE=host-b.example:7070" in text
    with pytest.raises(GuideError, match="host-c runs no peer"):
        machines["host-c"].as_peer(block.text)


def test_each_drill_and_the_first_day_have_their_blocks():
    sections = {(b.section, b.subsection) for b in read_guide()}
    for needed in [("Installing", ""), ("Certificates and tokens", ""), ("Starting the servers", ""),
                   ("A systemd unit per peer", ""), ("Checking it", ""), ("A first message", ""),
                   ("Upgrading twinflow", ""), ("Changing a running flow", ""),
                   ("Rotating certificates and tokens", "Tokens"),
                   ("Rotating certificates and tokens", "A new CA and its certificates"),
                   ("Backing up and restoring a flow", "Taking a backup"),
                   ("Backing up and restoring a flow", "Restoring")]:
        assert needed in sections, needed


def test_a_file_outside_a_hosts_own_directories_and_a_bad_annotation_are_refused_with_the_line():
    with pytest.raises(GuideError, match=r"/etc/passwd on host-a: the lab keeps a host's own files under /etc/twinflow"):
        hosts()["host-a"].path("/etc/passwd")
    with pytest.raises(GuideError, match="deploy.md line 2: a lab annotation starts with one of install, run"):
        parse_guide("text\n<!-- lab: sometimes host-a -->\n```sh\ntrue\n```\n")
    with pytest.raises(GuideError, match="deploy.md line 1: the annotation must stand just above a ``` block"):
        parse_guide("<!-- lab: run host-a -->\n\n```sh\ntrue\n```\n")
    assert "/etc/twinflow" in ROOTED and "/opt/twinflow" in ROOTED
