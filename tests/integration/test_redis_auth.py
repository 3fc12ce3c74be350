"""Redis credentials and TLS against real redis-server processes: requirepass, an ACL user,
TLS with a CA (and client certificates), a flow's scripts over all of it, and no password
in any log line or error.

Each server is a :class:`LocalRedis` on 127.0.0.1, started once for the module and stopped
by PID. Passwords are fresh random tokens, so finding one in a text can only mean a leak.
Certificates come from ``trustme`` (a throwaway CA).
"""

from __future__ import annotations

import logging
import secrets

import pytest
import redis
import trustme

from twinflow.cluster.connect import ServiceUnavailable, connect_redis
from twinflow.testing.services import LocalRedis, RedisTls
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store.redis_auth import (ENV_CA, ENV_CERT, ENV_KEY, ENV_PASSWORD, RedisSettingsError,
                                               client_options)
from twinflow.runtime.store.redis_slot import client_from_url, follow_moved

# Short: a refused connect is retried until its deadline (a password being
# rotated may be accepted a moment later), and these tests wait that out.
REFUSED_DEADLINE_S = 0.6


def token() -> str:
    return "pw-" + secrets.token_hex(12)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No Redis settings from the shell that runs the tests: each test sets its own."""
    for name in (ENV_PASSWORD, ENV_CA, ENV_CERT, ENV_KEY):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("twinflow-node")
    files = {"ca": ca.cert_pem, "cert": server.cert_chain_pems[0], "key": server.private_key_pem,
             "client_cert": client.cert_chain_pems[0], "client_key": client.private_key_pem}
    for name, blob in files.items():
        blob.write_to_path(str(d / f"{name}.pem"))
    return {name: str(d / f"{name}.pem") for name in files}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tls_files):
    """The module's servers by name, each with its password; all stopped by PID afterwards."""
    started: dict[str, LocalRedis] = {}
    tls = RedisTls(tls_files["cert"], tls_files["key"], tls_files["ca"])
    mtls = RedisTls(tls_files["cert"], tls_files["key"], tls_files["ca"], auth_clients=True,
                    client_cert=tls_files["client_cert"], client_key=tls_files["client_key"])
    kinds = {"requirepass": {}, "acl": {"user": "app"}, "tls": {"tls": tls}, "tls_b": {"tls": tls},
             "mtls": {"tls": mtls}}
    try:
        for name, kw in kinds.items():
            started[name] = LocalRedis.start(str(tmp_path_factory.mktemp(name)), password=token(),
                                             deadline_s=10, **kw)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def password_file(tmp_path):
    """Write a password to a file as an operator would (with ``echo``: a trailing newline);
    returns the reference to it."""
    def write(password: str) -> str:
        path = tmp_path / "redis.pw"
        path.write_text(password + "\n")
        return f"file:{path}"
    return write


# -- (a) requirepass ---------------------------------------------------------------------------

def test_requirepass_with_the_password_from_a_file_reference(servers, password_file, monkeypatch):
    r = servers["requirepass"]
    monkeypatch.setenv(ENV_PASSWORD, password_file(r.password))
    client = connect_redis(r.url, 5)
    assert r.password not in r.url  # the URL a peer's command line shows carries none
    assert client.acl_whoami() == "default"
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_requirepass_without_a_password_fails_saying_so(servers, caplog):
    r = servers["requirepass"]
    with caplog.at_level(logging.WARNING, logger="twinflow.connect"):
        with pytest.raises(ServiceUnavailable) as err:
            connect_redis(r.url, REFUSED_DEADLINE_S)
    assert isinstance(err.value.last_error, redis.AuthenticationError)
    assert "none was given" in str(err.value) and ENV_PASSWORD in str(err.value)
    assert caplog.records and r.password not in caplog.text


def test_requirepass_with_a_wrong_password_fails_without_showing_it(servers, monkeypatch, caplog):
    r = servers["requirepass"]
    wrong = token()
    monkeypatch.setenv("TF_TEST_REDIS_PW", wrong)
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_REDIS_PW")
    with caplog.at_level(logging.WARNING, logger="twinflow.connect"):
        with pytest.raises(ServiceUnavailable) as err:
            connect_redis(r.url, REFUSED_DEADLINE_S)
    assert "refused the user or password" in str(err.value)
    for text in (str(err.value), caplog.text):
        assert wrong not in text and r.password not in text


def test_a_password_reference_that_cannot_be_read_fails_at_once(tmp_path, monkeypatch):
    # Not retried until the deadline: waiting does not create the file.
    monkeypatch.setenv(ENV_PASSWORD, f"file:{tmp_path / 'missing.pw'}")
    with pytest.raises(RedisSettingsError, match=ENV_PASSWORD):
        connect_redis("redis://127.0.0.1:1/0", 60)


# -- (b) ACL user --------------------------------------------------------------------------------

def test_acl_user_from_the_url_with_the_password_from_the_environment(servers, monkeypatch):
    r = servers["acl"]
    monkeypatch.setenv("TF_TEST_REDIS_PW", r.password)
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_REDIS_PW")
    assert r.url.startswith("redis://app@")
    client = connect_redis(r.url, 5)
    assert client.acl_whoami() == "app"
    # The same password without the user name is refused: the default user is off,
    # so the connection above really authenticated as "app".
    with pytest.raises(ServiceUnavailable) as err:
        connect_redis(f"redis://127.0.0.1:{r.port}/0", REFUSED_DEADLINE_S)
    assert isinstance(err.value.last_error, redis.AuthenticationError)
    assert r.password not in str(err.value)


def test_a_password_in_the_url_works_and_wins_over_the_environment(servers, monkeypatch):
    r = servers["acl"]
    monkeypatch.setenv("TF_TEST_REDIS_PW", token())  # wrong: ignored, the URL's is more specific
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_REDIS_PW")
    client = connect_redis(f"redis://app:{r.password}@127.0.0.1:{r.port}/0", 5)
    assert client.acl_whoami() == "app"


# -- (c) TLS -------------------------------------------------------------------------------------

def test_tls_with_the_ca_from_the_environment(servers, tls_files, monkeypatch):
    r = servers["tls"]
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_REDIS_PW")
    monkeypatch.setenv("TF_TEST_REDIS_PW", r.password)
    monkeypatch.setenv(ENV_CA, tls_files["ca"])
    assert r.url.startswith("rediss://")
    client = connect_redis(r.url, 5)
    assert client.ping()
    assert client.connection_pool.connection_class is redis.SSLConnection


def test_tls_without_the_ca_refuses_the_server(servers, monkeypatch):
    # The system trust store does not know the test CA: the certificate is checked.
    r = servers["tls"]
    monkeypatch.setenv("TF_TEST_REDIS_PW", r.password)
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_REDIS_PW")
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        client_from_url(r.url, socket_connect_timeout=2).ping()


def test_tls_settings_with_a_plain_url_are_refused(servers, tls_files, monkeypatch):
    # A CA set means TLS was meant: talking in clear text instead would be silent.
    monkeypatch.setenv(ENV_CA, tls_files["ca"])
    with pytest.raises(RedisSettingsError, match="not a rediss:// URL"):
        connect_redis(f"redis://127.0.0.1:{servers['tls'].port}/0", 60)


def test_client_certificate_for_tls_auth_clients(servers, tls_files, monkeypatch):
    r = servers["mtls"]
    monkeypatch.setenv("TF_TEST_REDIS_PW", r.password)
    monkeypatch.setenv(ENV_PASSWORD, "env:TF_TEST_REDIS_PW")
    monkeypatch.setenv(ENV_CA, tls_files["ca"])
    with pytest.raises(redis.ConnectionError):  # no client certificate: the server ends the handshake
        client_from_url(r.url, socket_connect_timeout=2).ping()
    monkeypatch.setenv(ENV_CERT, tls_files["client_cert"])
    with pytest.raises(RedisSettingsError, match="go together"):
        client_options(r.url)
    monkeypatch.setenv(ENV_KEY, tls_files["client_key"])
    assert connect_redis(r.url, 5).ping()


def test_a_moved_client_keeps_password_and_tls(servers, tls_files, monkeypatch):
    """The client that follows MOVED (a Redis Cluster's failover) to another node keeps the
    user, password and TLS files: the client is built for "tls" with the password of "tls_b"
    (TLS only, a password of its own), which answers only if both survive the move."""
    a, b = servers["tls"], servers["tls_b"]
    redis.Redis(port=b.port, password=b.password, ssl=True, ssl_ca_certs=tls_files["ca"]).set("who", "b")
    monkeypatch.setenv(ENV_CA, tls_files["ca"])
    client = client_from_url(f"rediss://127.0.0.1:{a.port}/0", password=b.password)
    moved = follow_moved(client, redis.exceptions.MovedError(f"1 127.0.0.1:{b.port}"))
    assert moved.get("who") == b"b"
    assert moved.connection_pool.connection_class is redis.SSLConnection
    assert moved.connection_pool.connection_kwargs["ssl_ca_certs"] == tls_files["ca"]


# -- (d) a flow's store over password + TLS ------------------------------------------------------

def test_flow_store_scripts_run_over_password_and_tls(servers, tls_files, password_file, monkeypatch, flow_name):
    r = servers["tls"]
    monkeypatch.setenv(ENV_PASSWORD, password_file(r.password))
    monkeypatch.setenv(ENV_CA, tls_files["ca"])
    keys = FlowKeys(flow_name)
    store = FlowStore(connect_redis(r.url, 5, slot_key=keys.uplink), keys, "node-a")
    try:
        assert store.config_problems() == []  # CONFIG GET over the same connection
        ids = store.publish([b'{"n":1}', b'{"n":2}'])
        rows = store.read_uplink(None, "+", 10, 1 << 20)  # the read_batch Lua script
        assert [(pos, data) for pos, data, _ in rows] == [(ids[0], b'{"n":1}'), (ids[1], b'{"n":2}')]
        assert store.raise_epoch(3) == 3 and store.raise_epoch(2) == 3  # another script
    finally:
        store.close()


# -- (e) redaction -------------------------------------------------------------------------------

def test_a_failing_connect_logs_and_raises_no_password_from_the_url(servers, caplog):
    r = servers["requirepass"]
    wrong = token()
    url = f"redis://:{wrong}@127.0.0.1:{r.port}/0"
    with caplog.at_level(logging.WARNING, logger="twinflow.connect"):
        with pytest.raises(ServiceUnavailable) as err:
            connect_redis(url, REFUSED_DEADLINE_S)
    assert caplog.records, "the retries were not logged"
    assert f"redis://:***@127.0.0.1:{r.port}/0" in caplog.text  # where it tried, password out
    for text in (caplog.text, str(err.value), str(err.value.last_error), err.value.where):
        assert wrong not in text


@pytest.mark.parametrize("password", ["s3/cr3t", "s3?cr3t", "s3#cr3t", "s3@cr3t"])
def test_a_url_password_that_would_be_misparsed_is_refused_without_echoing_it(password, caplog):
    # An unencoded "/" ends the host part: urllib would take "s3" for the port and its
    # error quotes it; after an "@" redact_url would hide only "s3". Refused, naming neither.
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(RedisSettingsError, match="percent-encoded") as err:
            connect_redis(f"redis://app:{password}@127.0.0.1:6379/0", 60)
    assert "s3" not in str(err.value) and "cr3t" not in str(err.value) and "cr3t" not in caplog.text
    # Percent-encoded, the same password is taken whole: accepted.
    encoded = password.replace("/", "%2F").replace("?", "%3F").replace("#", "%23").replace("@", "%40")
    assert client_options(f"redis://app:{encoded}@127.0.0.1:6379/0") == {}
