"""ZooKeeper digest credentials and the ACLs of a flow's znodes, on a real ZooKeeper.

A peer given ``TWINFLOW_ZK_AUTH`` creates ``/twinflow/<flow>`` and everything
below it (election queue, members, epoch) for its identity only: a client
without the credentials, or with other ones, can neither list nor read the
members, nor delete or jump the election queue, nor touch the epoch.
``/twinflow`` stays shared, so flows with different credentials coexist. A
flow created open is protected by its first peer that has credentials; a peer
without them on a protected flow fails at start, naming the path.
"""

import logging

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NotEmptyError
from kazoo.security import make_digest_acl

from tests.conftest import wait_until
from twinflow.cluster.connect import ServiceUnavailable, connect_zookeeper
from twinflow.cluster.leadership import Leadership
from twinflow.testing.servers import free_port
from twinflow.testing.services import LocalServices
from twinflow.cluster.zk_auth import PARENT_ACL, ZK_AUTH_ENV, ZkAccessDenied
from twinflow.secrets import SecretError

USER, PASSWORD = "flowuser", "s3cret-Pa55"


# A ZooKeeper of this module's own (overriding the session one, so the server
# logs still reach a failing test's report): /twinflow starts absent here, so
# which ACL a peer gives it is what this module sees, not what another test left.
@pytest.fixture(scope="module")
def services(tmp_path_factory):
    svc = LocalServices.start(base_dir=str(tmp_path_factory.mktemp("zk-auth")))
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def zk_hosts(services) -> str:
    return services.zk_hosts


@pytest.fixture
def with_credentials(monkeypatch, tmp_path):
    """Set TWINFLOW_ZK_AUTH to a file reference holding user:password, as an operator would."""

    def set_(user: str = USER, password: str = PASSWORD) -> None:
        secret = tmp_path / f"zk-{user}"
        secret.write_text(f"{user}:{password}\n")
        secret.chmod(0o600)
        monkeypatch.setenv(ZK_AUTH_ENV, f"file:{secret}")

    return set_


@pytest.fixture
def closing():
    """Stops every Leadership and kazoo client registered with it, last first."""
    things = []
    yield things.append
    for thing in reversed(things):
        try:
            thing.stop()
        finally:
            if isinstance(thing, KazooClient):
                thing.close()


def start_node(zk_hosts, flow, peer_id, closing):
    """A peer's ZooKeeper side, as `twinflow run` builds it: connect_zookeeper, then a Leadership."""
    zk = connect_zookeeper(zk_hosts, 10, session_timeout_s=2.0)
    closing(zk)
    me = Leadership(zk, flow, peer_id, f"127.0.0.1:{free_port()}", lambda epoch: None, lambda reason: None)
    closing(me)
    me.start()
    return me


def outsider(zk_hosts, kind, closing) -> KazooClient:
    auth = {"no credentials": None,
            "a wrong password": [("digest", f"{USER}:not-the-password")],
            "another user": [("digest", f"intruder:{PASSWORD}")]}[kind]
    zk = KazooClient(hosts=zk_hosts, auth_data=auth, timeout=2.0)
    zk.start(timeout=10)
    closing(zk)
    return zk


@pytest.mark.parametrize("kind", ["no credentials", "a wrong password", "another user"])
def test_a_protected_flow_is_closed_to_a_client_with(kind, zk_hosts, flow_name, with_credentials, closing):
    with_credentials()
    me = start_node(zk_hosts, flow_name, "n1", closing)
    wait_until(lambda: me.is_master, 10, what="n1 master")
    root = f"/twinflow/{flow_name}"
    [contender] = me.zk.get_children(f"{root}/election")

    # Every znode of the flow, the recipe's queue node and the ephemeral member
    # included, carries the peer's identity only.
    owner_acl = [make_digest_acl(USER, PASSWORD, all=True)]
    for path in (root, f"{root}/election", f"{root}/members", f"{root}/epoch",
                 f"{root}/members/n1", f"{root}/election/{contender}"):
        assert me.zk.get_acls(path)[0] == owner_acl, path

    other = outsider(zk_hosts, kind, closing)
    with pytest.raises(NoAuthError):
        other.get_children(f"{root}/members")
    with pytest.raises(NoAuthError):
        other.get(f"{root}/members/n1")
    with pytest.raises(NoAuthError):
        other.delete(f"{root}/election/{contender}")  # would end the master's role
    with pytest.raises(NoAuthError):
        other.create(f"{root}/election/x-", b"intruder", ephemeral=True, sequence=True)  # queue jumping
    with pytest.raises(NoAuthError):
        other.get(f"{root}/epoch")
    with pytest.raises(NoAuthError):
        other.delete(f"{root}/epoch")
    with pytest.raises(NoAuthError):
        other.set(f"{root}/epoch", b"intruder")  # a forged promotion
    # /twinflow lets anyone delete an empty flow (so an owner can clean up), but a
    # protected flow's root is never empty and its children are out of reach.
    with pytest.raises(NotEmptyError):
        other.delete(root)
    # What stays visible (docs/operations/security.md): ZooKeeper checks no ACL on exists(), so the
    # stat, the epoch's number with it, can be seen.
    assert other.exists(f"{root}/epoch").version == me.epoch
    # The shared parent stays open to read and create under: other flows can start.
    assert flow_name in other.get_children("/twinflow")
    other.create(f"/twinflow/{flow_name}-other", b"")
    other.delete(f"/twinflow/{flow_name}-other")

    # Nothing the outsider tried changed the flow.
    assert me.is_master and me.leader() == "n1"
    assert me.members() == {"n1": me.address}
    assert me.zk.exists(f"{root}/epoch").version == me.epoch


def test_flows_with_different_credentials_share_the_parent(zk_hosts, flow_name, with_credentials, closing):
    with_credentials()
    a = start_node(zk_hosts, flow_name, "a", closing)
    with_credentials("otheruser", "other-Pa55")
    b = start_node(zk_hosts, f"{flow_name}b", "b", closing)
    wait_until(lambda: a.is_master and b.is_master, 10, what="both flows' masters")
    assert a.zk.get_acls("/twinflow")[0] == PARENT_ACL  # not one flow's digest: that would lock the other out
    # Nobody may change the parent, so no flow can lock the others out of it.
    for zk in (a.zk, b.zk):
        with pytest.raises(NoAuthError):
            zk.set_acls("/twinflow", [make_digest_acl(USER, PASSWORD, all=True)])
        with pytest.raises(NoAuthError):
            zk.set("/twinflow", b"mine")
    with pytest.raises(NoAuthError):
        a.zk.get_children(b.paths.members)
    with pytest.raises(NoAuthError):
        b.zk.get_children(a.paths.members)


def test_a_node_without_credentials_fails_at_start_naming_the_path(zk_hosts, flow_name, with_credentials,
                                                                   monkeypatch, closing):
    with_credentials()
    owner = start_node(zk_hosts, flow_name, "n1", closing)
    wait_until(lambda: owner.is_master, 10, what="n1 master")

    monkeypatch.delenv(ZK_AUTH_ENV)
    with pytest.raises(ZkAccessDenied) as denied:
        start_node(zk_hosts, flow_name, "n2", closing)
    message = str(denied.value)
    assert f"/twinflow/{flow_name}/members" in message
    assert "authentication is needed" in message and ZK_AUTH_ENV in message

    with_credentials(USER, "not-the-password")
    with pytest.raises(ZkAccessDenied) as denied:
        start_node(zk_hosts, flow_name, "n3", closing)
    message = str(denied.value)
    # Refused at the flow's root: with credentials the peer reads each znode's ACL first.
    assert f"access to /twinflow/{flow_name}:" in message and f"{USER}:***" in message
    assert "not-the-password" not in message

    # Neither got in: no member znode, no place in the election queue.
    assert owner.members() == {"n1": owner.address}
    assert owner.zk.Election(owner.paths.election).contenders() == ["n1"]


def test_credentials_turned_on_for_an_open_flow_protect_it(zk_hosts, flow_name, with_credentials, monkeypatch,
                                                           caplog, closing):
    monkeypatch.delenv(ZK_AUTH_ENV, raising=False)
    old = start_node(zk_hosts, flow_name, "old", closing)
    wait_until(lambda: old.is_master, 10, what="the open flow's master")
    root = f"/twinflow/{flow_name}"
    anyone = outsider(zk_hosts, "no credentials", closing)
    assert anyone.get_children(f"{root}/members") == ["old"]  # open: it was made without credentials

    # The upgrade: a peer started with credentials while the old one still runs.
    with_credentials()
    with caplog.at_level(logging.WARNING, logger="twinflow.leadership"):
        new = start_node(zk_hosts, flow_name, "new", closing)
    # Each change is logged, the digest's hash left out.
    assert f"{root}/epoch had ACL world:anyone:cdrwa; now digest:{USER}:***:cdrwa" in caplog.text
    owner_acl = [make_digest_acl(USER, PASSWORD, all=True)]
    for path in (root, f"{root}/election", f"{root}/members", f"{root}/epoch", f"{root}/members/old"):
        assert new.zk.get_acls(path)[0] == owner_acl, path
    with pytest.raises(NoAuthError):
        anyone.get_children(f"{root}/members")
    with pytest.raises(NoAuthError):
        anyone.get(f"{root}/members/old")  # the old peer's address, protected too

    # The old peer is then restarted (here: stopped); the protected flow goes on
    # under the new peer, at a newer epoch on the same epoch znode.
    old_epoch = old.epoch
    old.stop()
    old.zk.stop()
    wait_until(lambda: new.is_master, 10, what="the peer with credentials to take over")
    assert new.epoch > old_epoch
    assert new.members() == {"new": new.address}


def test_credentials_come_from_a_reference_and_the_password_is_never_logged(zk_hosts, flow_name, monkeypatch,
                                                                            caplog, closing):
    monkeypatch.setenv("TF_TEST_ZK_SECRET", f"{USER}:{PASSWORD}")
    monkeypatch.setenv(ZK_AUTH_ENV, "env:TF_TEST_ZK_SECRET")
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="kazoo")  # whatever an earlier test set it to
    me = start_node(zk_hosts, flow_name, "n1", closing)
    wait_until(lambda: me.is_master, 10, what="n1 master")
    assert me.zk.get_acls(me.paths.root)[0] == [make_digest_acl(USER, PASSWORD, all=True)]
    # kazoo logged the Auth packet it sent (at DEBUG): with the password taken out.
    assert f"auth='{USER}:***'" in caplog.text
    assert PASSWORD not in caplog.text

    # A value that is not user:password is refused before any connection is tried (here to a
    # port nothing answers on, which would end in ServiceUnavailable), without it in the message.
    monkeypatch.setenv("TF_TEST_ZK_SECRET", PASSWORD)
    with pytest.raises(SecretError) as bad:
        connect_zookeeper(f"127.0.0.1:{free_port()}", 30)
    assert PASSWORD not in str(bad.value)

    # A server that does not answer: the error names the identity, not the password.
    monkeypatch.setenv("TF_TEST_ZK_SECRET", f"{USER}:{PASSWORD}")
    with pytest.raises(ServiceUnavailable) as down:
        connect_zookeeper(f"127.0.0.1:{free_port()}", 0.2)
    assert f"as {USER}:***" in str(down.value) and PASSWORD not in str(down.value)
    assert PASSWORD not in caplog.text
