"""Local servers: a port taken between pick and bind is retried, not fatal."""

import socket

from twinflow.cluster import services as services_module
from twinflow.cluster.services import LocalServices, redis_answers, zk_answers


def test_a_port_taken_before_the_server_binds_it_is_retried(monkeypatch, tmp_path):
    # Hold one port the way an outgoing connection would, and hand it out as
    # the first pick for each server: both must land on a later pick.
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_free_port = services_module.free_port
    picks: list[int] = []

    def first_pick_taken() -> int:
        port = taken if len(picks) % 2 == 0 else real_free_port()
        picks.append(port)
        return port

    monkeypatch.setattr(services_module, "free_port", first_pick_taken)
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
