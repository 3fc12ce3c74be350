"""Local servers: a port taken between pick and bind is retried, not fatal."""

import socket

from twinflow.testing import servers as servers_module
from twinflow.testing.servers import redis_answers, zk_answers
from twinflow.testing.services import LocalServices


def test_a_port_taken_before_the_server_binds_it_is_retried(monkeypatch, tmp_path):
    # Hold one port the way an outgoing connection would, and hand it out as
    # the first pick for each server: both must land on a later pick.
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_free_port = servers_module.free_port
    picks: list[int] = []

    def first_pick_taken() -> int:
        port = taken if len(picks) % 2 == 0 else real_free_port()
        picks.append(port)
        return port

    monkeypatch.setattr(servers_module, "free_port", first_pick_taken)
    svc = LocalServices.start(base_dir=str(tmp_path))
    try:
        assert picks.count(taken) == 2, picks
        assert taken not in (svc.redis.port, svc.zookeeper.port)
        assert redis_answers(svc.redis.port) and zk_answers(svc.zookeeper.port)
        # The failed starts' logs are kept beside the live ones.
        assert (tmp_path / "redis" / f"redis.log.port-{taken}").exists()
        assert (tmp_path / "zookeeper" / f"zookeeper.log.port-{taken}").exists()
    finally:
        svc.stop()
        squatter.close()


def test_a_zookeeper_ensemble_survives_its_leader_restarting(tmp_path):
    from kazoo.client import KazooClient

    from twinflow.testing.zk_ensemble import LocalZkEnsemble

    ens = LocalZkEnsemble.start(str(tmp_path), n=3)
    zk = KazooClient(hosts=ens.hosts, timeout=10.0)
    try:
        assert len(ens.servers) == 3 and len({s.port for s in ens.servers}) == 3
        modes = sorted(ens.mode(i) for i in range(3))
        assert modes == ["follower", "follower", "leader"]
        zk.start(timeout=20)
        zk.create("/probe", b"x", ephemeral=True)
        leader = ens.leader()
        ens.kill(leader)
        ens.wait_serving(60)
        new_leader = ens.leader()
        assert new_leader is not None and new_leader != leader
        # The client's session lives on through a surviving member.
        assert zk.retry(zk.exists, "/probe") is not None
        ens.start_again(leader)
        assert ens.mode(leader) in ("follower", "leader")
        assert sorted(ens.mode(i) for i in range(3)).count("leader") == 1
    finally:
        zk.stop()
        zk.close()
        ens.stop()
