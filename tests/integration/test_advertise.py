"""The address a peer advertises: what works off loopback, and what is refused at start with what to change."""

import subprocess
import sys

import pytest

from twinflow.certs import make_certs
from twinflow.cluster.advertise import advertised, certificate_names, check_advertise
from twinflow.cluster.on_cluster import StartRefused
from twinflow.grpc_security import TlsFiles
from twinflow.testing.servers import free_port

LOCAL = {"redis_url": "redis://127.0.0.1:6379/0", "zk_hosts": "127.0.0.1:2181"}
REMOTE = {"redis_url": "redis+sentinel://redis.lab:26379,redis.lab:26380/flows/0",
          "zk_hosts": "zk1.lab:2181,zk2.lab:2181,zk3.lab:2181"}


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    make_certs(d, "peer-a", ["peer-a.lab", "10.213.47.21"])
    return TlsFiles(cert=str(d / "peer-a.pem"), key=str(d / "peer-a-key.pem"), ca=str(d / "ca.pem"), mutual=True)


def test_a_wildcard_bind_advertises_the_name_given():
    assert advertised("0.0.0.0:7070", "peer-a.lab:7070", 7070) == "peer-a.lab:7070"
    assert advertised("[::]:7070", "[fd00::5]:7070", 7070) == "[fd00::5]:7070"
    assert advertised("127.0.0.1:0", None, 40001) == "127.0.0.1:40001"
    check_advertise("0.0.0.0:7070", "peer-a.lab:7070", tls=None, **REMOTE)  # accepted


def test_a_wildcard_bind_without_an_advertised_address_is_refused():
    for listen in ("0.0.0.0:7070", "[::]:7070", ":7070"):
        with pytest.raises(StartRefused, match="pass --advertise HOST:PORT"):
            check_advertise(listen, None, tls=None, **REMOTE)


def test_an_advertised_address_without_a_port_is_refused():
    for advertise in ("peer-a.lab", "peer-a.lab:0", "peer-a.lab:http"):
        with pytest.raises(StartRefused, match="needs a host and a port"):
            check_advertise("0.0.0.0:7070", advertise, tls=None, **REMOTE)


def test_a_loopback_address_is_refused_only_when_the_servers_are_elsewhere():
    for advertise in ("127.0.0.1:7070", "localhost:7070", "[::1]:7070"):
        with pytest.raises(StartRefused, match="loopback address, but Redis or ZooKeeper is on redis.lab"):
            check_advertise("127.0.0.1:7070", advertise, tls=None, **REMOTE)
        check_advertise("127.0.0.1:7070", advertise, tls=None, **LOCAL)  # one machine: fine


def test_the_certificate_must_name_the_advertised_host(cert):
    assert sorted(certificate_names(cert.cert)) == ["10.213.47.21", "peer-a.lab"]
    check_advertise("0.0.0.0:7070", "peer-a.lab:7070", tls=cert, **REMOTE)
    check_advertise("0.0.0.0:7070", "10.213.47.21:7070", tls=cert, **REMOTE)
    with pytest.raises(StartRefused, match=r"names peer-a.lab, 10.213.47.21, not peer-b.lab.*--name peer-b.lab"):
        check_advertise("0.0.0.0:7070", "peer-b.lab:7070", tls=cert, **REMOTE)


def test_a_server_name_override_is_the_name_checked(cert):
    named = TlsFiles(cert=cert.cert, key=cert.key, ca=cert.ca, server_name="peer-a.lab")
    check_advertise("0.0.0.0:7070", "10.213.47.99:7070", tls=named, **REMOTE)  # the others check peer-a.lab
    wrong = TlsFiles(cert=cert.cert, key=cert.key, ca=cert.ca, server_name="peer-b.lab")
    with pytest.raises(StartRefused, match="not peer-b.lab"):
        check_advertise("0.0.0.0:7070", "peer-a.lab:7070", tls=wrong, **REMOTE)


def test_twinflow_run_refuses_before_connecting_to_anything(tmp_path):
    nothing = free_port()  # no Redis there: a start that got as far as Redis would wait, then exit 3
    done = subprocess.run([sys.executable, "-m", "twinflow.cli", "run", "examples/cluster.yaml", "--peer-id", "a",
                           "--redis", f"redis://127.0.0.1:{nothing}/0", "--zk", "127.0.0.1:1",
                           "--listen", "0.0.0.0:0", "--insecure", "--connect-timeout", "30",
                           "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert "pass --advertise HOST:PORT" in done.stderr and "waiting for Redis" not in done.stderr
