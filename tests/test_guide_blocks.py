"""The deployment guide's blocks stay runnable by its lab: every annotation parses, names hosts the
guide has, fills every placeholder, and each section the guide's drills run has its blocks.
(The drills themselves run the blocks: `twinflow drill guide-all --hosts`.)"""

from __future__ import annotations

import shlex

import pytest

from twinflow_dev.guide_blocks import ROOTED, GuideError, GuideHost, parse_guide, read_guide
from twinflow_dev.guide_hosts import HOSTS
from twinflow_dev.guide_servers import SERVER_NAMES

SECRETS = {"password": "pw", "zookeeper password": "zk-pw", "the peers' version": "0.2.0"}


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
                    assert words[1] in ("daemon-reload", "enable", "disable", "start", "stop", "restart"), line


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
                   ("Monitoring", ""), ("Upgrading twinflow", ""), ("Upgrading twinflow", "Rolling back"),
                   ("Changing a running flow", ""),
                   ("Rotating certificates and tokens", "Tokens"),
                   ("Rotating certificates and tokens", "A new CA and its certificates"),
                   ("Backing up and restoring a flow", "Taking a backup"),
                   ("Backing up and restoring a flow", "Restoring"),
                   ("Changing the machines", ""), ("Changing the machines", "Adding a peer"),
                   ("Changing the machines", "Removing a peer"),
                   ("Changing the machines", "Replacing a ZooKeeper server"),
                   ("Changing the machines", "Adding a ZooKeeper server"),
                   ("Changing the machines", "Removing a ZooKeeper server"),
                   ("Changing the machines", "Adding a Redis server"),
                   ("Changing the machines", "Removing a Redis server")]:
        assert needed in sections, needed


def test_a_file_outside_a_hosts_own_directories_and_a_bad_annotation_are_refused_with_the_line():
    with pytest.raises(GuideError, match=r"/etc/passwd on host-a: the lab keeps a host's own files under /etc/twinflow"):
        hosts()["host-a"].path("/etc/passwd")
    with pytest.raises(GuideError, match="deploy.md line 2: a lab annotation starts with one of install, run"):
        parse_guide("text\n<!-- lab: sometimes host-a -->\n```sh\ntrue\n```\n")
    with pytest.raises(GuideError, match="deploy.md line 1: the annotation must stand just above a ``` block"):
        parse_guide("<!-- lab: run host-a -->\n\n```sh\ntrue\n```\n")
    assert "/etc/twinflow" in ROOTED and "/opt/twinflow" in ROOTED


def _commands(section: str, subsection: str | None = None, host: str | None = None) -> list[list[str]]:
    """The shell commands of a section's run blocks, split into words (as host-a reads them)."""
    out = []
    for b in read_guide():
        if b.section != section or (subsection is not None and b.subsection != subsection) or b.kind != "run":
            continue
        if host is not None and host not in b.hosts:
            continue
        out += [shlex.split(line) for line in b.lines()]
    return out


def test_what_root_reads_under_etc_twinflow_is_roots_never_the_service_users():
    """The service user runs handler code: nothing root sources or reads under /etc/twinflow may be
    its to change (an install -o twinflow there, a directory of its own there)."""
    host = hosts()["host-a"]
    for b in read_guide():
        text = host.fill(b.text, SECRETS)
        for line in [s for s in text.splitlines() if s.strip() and not s.startswith("#")] if b.kind in ("run", "install") else []:
            words = shlex.split(line)
            if words[0] != "install":
                continue
            owner = words[words.index("-o") + 1] if "-o" in words else "root"
            targets = [w for w in words[1:] if w.startswith(("/etc/", '"$FLOW"', "$FLOW"))]
            if any(t.startswith("/etc/twinflow") or "FLOW" in t for t in targets):
                assert owner == "root", (b.line, line)
                mode = words[words.index("-m") + 1] if "-m" in words else "0755"
                assert int(mode, 8) & 0o022 == 0, (b.line, line)  # no group or other write
    unit = next(b for b in read_guide() if b.path is None and "twinflow-peer@.service" in b.text and b.kind == "run")
    assert "install -o root -g twinflow -m 0640 deploy/systemd/peer.env.example /etc/twinflow/peer-a.env" in unit.text


def test_redis_files_are_redis_s_and_etc_redis_is_left_as_debian_made_it():
    text = "\n".join(b.text for b in read_guide() if b.kind in ("run", "install"))
    assert "/etc/redis" not in " ".join(line for line in text.splitlines() if line.startswith("install -d"))
    assert "chown redis:redis /etc/redis/redis.conf /etc/redis/sentinel.conf" in text
    stop = text.index("systemctl stop redis-server redis-sentinel")
    assert stop < text.index("systemctl restart redis-server redis-sentinel twinflow-zookeeper")
    assert "apt-get update" in text and "curl netcat-openbsd" in text


def test_a_flow_change_is_validated_before_it_is_copied_and_restarted_on_every_machine():
    peer = [w for w in _commands("Changing a running flow", host="host-a")]
    verbs = [" ".join(w[:2]) for w in peer]
    validate = next(i for i, w in enumerate(peer) if w[:2] == ["twinflow", "validate"])
    copy = next(i for i, w in enumerate(peer) if w[0] == "install" and w[-1] == "$FLOW")
    restart = next(i for i, w in enumerate(peer) if w[:2] == ["systemctl", "restart"])
    assert validate < copy < restart, verbs
    assert peer[validate][2] == "flow-new.yaml"  # the new file, not the live one
    client = _commands("Changing a running flow", host="host-c")
    assert [w[1:3] for w in client if "validate" in w] == [["validate", "flow-new.yaml"]]
    assert client[-1][-1] == "/etc/twinflow/flow.yaml"


def test_the_upgrade_names_one_wheel_and_backs_up_first_and_a_rollback_restores():
    blocks = [b for b in read_guide() if b.section == "Upgrading twinflow" and b.kind == "run"]
    assert "twinflow backup" in blocks[0].text and "version-before-upgrade" in blocks[0].text
    upgrade = next(b.text for b in blocks if "--upgrade" in b.text)
    assert '"$(ls -v twinflow-*.whl | tail -n 1)"' in upgrade and "--upgrade twinflow-*.whl" not in upgrade
    back = "".join(b.text for b in blocks if b.subsection == "Rolling back")
    assert "twinflow restore" in back and "version-before-upgrade" in back and "before-upgrade-" in back


def test_a_token_rotation_gives_the_operators_machine_the_new_admin_token_and_checks_it():
    copies = [b for b in read_guide() if b.kind == "copy" and b.hosts == ["host-a", "host-c"]]
    assert any("/etc/twinflow/tokens-next/admin.token" in b.text for b in copies)
    client = "".join(b.text for b in read_guide()
                     if b.subsection == "Tokens" and b.kind == "run" and b.hosts == ["host-c"])
    assert "> /etc/twinflow/tls/admin.token" in client and ". /etc/twinflow/operator.env" in client


def test_metrics_are_bound_to_the_machines_address_and_prometheus_scrapes_every_peer():
    import yaml

    from twinflow_dev.guide_blocks import REPO

    enable = next(b for b in read_guide() if "systemctl enable --now twinflow-peer@peer-a" in b.text)
    assert "s/^METRICS=.*/METRICS=<this machine's address>:9464/" in enable.text
    scrape = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    job = next(j for j in scrape["scrape_configs"] if j["job_name"] == "twinflow")
    assert job["file_sd_configs"] == [{"files": ["/etc/prometheus/twinflow-targets.yml"]}]
    groups = yaml.safe_load((REPO / "deploy/prometheus/twinflow-targets.yml").read_text())
    targets = [t for g in groups for t in g["targets"]]
    assert targets == [f"{h}.example:9464" for h, (_, peer) in HOSTS.items() if peer in ("peer-a", "peer-b")]
    assert "/etc/prometheus/twinflow-rules.yml" in scrape["rule_files"]
    assert ("Monitoring", "") in {(b.section, b.subsection) for b in read_guide()}


def test_the_shipped_prometheus_configuration_passes_promtool(tmp_path):
    import shutil
    import subprocess

    from twinflow_dev.guide_blocks import REPO

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (make bootstrap installs Debian's prometheus)")
    rules = REPO / "deploy/prometheus/twinflow-rules.yml"
    config = (REPO / "deploy/prometheus/prometheus.yml").read_text().replace(
        "/etc/prometheus/twinflow-rules.yml", str(rules)).replace(
        "/etc/prometheus/twinflow-targets.yml", str(REPO / "deploy/prometheus/twinflow-targets.yml"))
    (tmp_path / "prometheus.yml").write_text(config)
    done = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_unsharded_pair_runs_spark_in_its_peers_and_the_table_says_what_a_spark_cluster_survives():
    from twinflow_dev.guide_blocks import GUIDE, REPO
    from twinflow_dev.systemd_unit import read_environment_file

    env = read_environment_file(REPO / "deploy/systemd/peer.env.example")
    assert env["TWINFLOW_SPARK_MASTER"] == "local[1]" and env["EXTRA_ARGS"] == ""
    assert not [b for b in read_guide() if b.kind == "serve"]  # every server under a unit
    text = GUIDE.read_text()
    assert "spark://host-c.example:7077" not in text
    assert "a Spark master and its only worker on one machine" in text


def test_the_shipped_units_run_as_service_users():
    from twinflow_dev.guide_blocks import REPO
    from twinflow_dev.systemd_unit import ServiceUnit, read_environment_file

    users = {}
    for path in sorted((REPO / "deploy/systemd").glob("*.service")):
        unit = ServiceUnit.read(path)
        users[path.name] = unit.user
        env = {**read_environment_file(REPO / "deploy/systemd/peer.env.example"),
               **read_environment_file(REPO / "deploy/systemd/spark.env.example")}
        assert unit.start_argv("peer-a", env)[0].startswith("/")
    assert users == {"twinflow-peer@.service": "twinflow", "twinflow-spark-master.service": "twinflow",
                     "twinflow-spark-worker.service": "twinflow", "twinflow-zookeeper.service": "zookeeper"}


def test_each_topology_change_has_its_commands_and_a_replacement_is_an_addition_then_a_removal():
    from twinflow.chaos.guide_drills import GUIDE_DRILLS
    from twinflow_dev.guide_blocks import GUIDE

    text = GUIDE.read_text()
    for kind in ("a peer", "a Redis server"):
        for verb in ("Adding", "Removing"):
            assert f"### {verb} {kind}" in text
    for heading in ("### Replacing a peer's machine", "### Replacing a Redis server"):
        section = text.split(heading, 1)[1].split("###", 1)[0]
        assert "Adding" in section and "Removing" in section, heading
    for verb in ("Adding", "Removing", "Replacing"):
        assert f"### {verb} a ZooKeeper server" in text
    assert {"topology-peer", "topology-zookeeper-add", "topology-zookeeper-remove", "topology-zookeeper",
            "topology-redis"} <= set(GUIDE_DRILLS)
    # The peers' list of ZooKeeper servers is edited without naming host-a (an as-peer block reads
    # host-a.example as its own machine's name).
    for b in read_guide():
        if "ZooKeeper server" in b.subsection and "as-peer" in b.flags:
            assert "host-a.example" not in b.text and "TWINFLOW_ZK" in b.text


def test_a_renewal_from_the_same_ca_first_checks_the_ca_outlives_the_new_certificates():
    blocks = [b for b in read_guide() if b.subsection == "New certificates from the same CA"]
    assert blocks[0].lines()[0] == "openssl x509 -checkend 31536000 -noout -in /etc/twinflow/tls/ca.pem"
    assert [b.kind for b in blocks] == ["run", "copy", "copy", "run", "run", "run"]


def _zk_blocks(subsection: str) -> list:
    return [b for b in read_guide() if b.section == "Changing the machines" and b.subsection == subsection]


def _server_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("server.")]


def test_a_zookeeper_server_is_added_first_then_the_others_take_the_longer_list_one_at_a_time():
    """Growing a static ensemble: the new server with the four-server list starts first (the
    running three are a majority of its list), then each other server, never two down at once,
    each checking every server leads or follows first and counting four voters after; the peers
    last."""
    from twinflow.chaos.guide_zookeeper import UNIT

    blocks = _zk_blocks("Adding a ZooKeeper server")
    assert [b.kind for b in blocks] == ["file", "run", "run", "run", "run"]
    cfg, new, rolling, check, peers = blocks
    assert cfg.hosts == ["host-d"] and cfg.path == "/etc/zookeeper/conf/zoo.cfg"
    first = next(b for b in read_guide() if b.section == "The ZooKeeper ensemble" and b.kind == "file")
    assert cfg.text.replace("server.4=host-d.example:2888:3888\n", "") == first.text
    assert _server_lines(cfg.text)[-1] == "server.4=host-d.example:2888:3888"
    assert new.hosts == ["host-d"] and "echo 4 > /var/lib/zookeeper/myid" in new.text
    assert f"systemctl enable --now {UNIT}" in new.text and "'^Mode: follower'" in new.text
    assert rolling.hosts == ["host-a", "host-b", "host-c"] and "one-at-a-time" in rolling.flags
    lines = rolling.lines()
    assert lines[0].startswith("for h in host-a host-b host-c host-d; do until printf 'srvr")
    assert "echo 'server.4=host-d.example:2888:3888' >> /etc/zookeeper/conf/zoo.cfg" in lines[1]
    assert lines[2] == f"systemctl restart {UNIT}" and "zk_quorum_size[[:space:]]4$" in lines[3]
    assert check.hosts == ["host-c"] and "zk_synced_followers[[:space:]]3$" in check.text
    assert peers.flags == {"as-peer", "one-at-a-time"} and ",host-d.example:2181/" in peers.text
    assert "--wait-streaming peer-a" in peers.text


def test_a_zookeeper_server_leaves_peers_first_never_leading_and_stops_last():
    """Shrinking: the peers stop naming it, it gives up a leader's role, the others take the
    shorter list one at a time (the leader last), and only then it stops for good, its data gone."""
    from twinflow.chaos.guide_zookeeper import UNIT

    blocks = _zk_blocks("Removing a ZooKeeper server")
    assert [(b.kind, b.hosts) for b in blocks] == [
        ("run", ["host-a", "host-b"]), ("run", ["host-d"]), ("run", ["host-a", "host-b", "host-c"]),
        ("run", ["host-d"]), ("run", ["host-c"])]
    peers, off_leader, rolling, stop, check = blocks
    assert "as-peer" in peers.flags and "s/,host-d.example:2181//" in peers.text
    steps = off_leader.lines()
    assert steps[0] == f"systemctl stop {UNIT}" and "'^Mode: leader'" in steps[1]
    assert steps[2] == f"systemctl start {UNIT}" and "'^Mode: follower'" in steps[3]
    assert "one-at-a-time" in rolling.flags and "sed -i '/^server.4=/d' /etc/zookeeper/conf/zoo.cfg" in rolling.text
    assert "zk_quorum_size[[:space:]]3$" in rolling.text
    assert stop.lines() == [f"systemctl disable --now {UNIT}", "rm -rf /var/lib/zookeeper/version-2 /var/lib/zookeeper/myid"]
    assert "zk_synced_followers[[:space:]]2$" in check.text and "host-d" not in check.text
    section = read_guide_text().split("### Removing a ZooKeeper server", 1)[1].split("###", 1)[0]
    assert "the leader last" in section


def read_guide_text() -> str:
    from twinflow_dev.guide_blocks import GUIDE

    return GUIDE.read_text()
