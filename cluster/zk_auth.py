"""ZooKeeper credentials and the ACLs of a flow's znodes.

A peer given credentials (``TWINFLOW_ZK_AUTH``, a secret reference as in
:mod:`twinflow.secrets` whose value is ``user:password``) authenticates with
ZooKeeper's ``digest`` scheme and creates every znode of its flow
(``/twinflow/<flow>`` and below) with :attr:`ZkCredentials.acl`: all
permissions for that identity, none for anyone else. ``/twinflow`` itself, shared by every
flow whatever its credentials, gets :data:`PARENT_ACL`.

Under failure: a reference that cannot be read, or a value that is not
``user:password``, raises :class:`~twinflow.secrets.SecretError` naming the
reference, never the value. A ZooKeeper call refused for want of the right
credentials is reported as :class:`ZkAccessDenied`, naming the path and
what to set. The password never reaches a log line: the client gets a
logger that takes it out of kazoo's own debug lines
(:meth:`ZkCredentials.client_kwargs`), and ``repr`` shows ``user:***``.

>>> import os
>>> os.environ["TF_DOCTEST_ZK"] = "flow-a:hunter2"
>>> creds = credentials_from("env:TF_DOCTEST_ZK")
>>> creds
ZkCredentials(user='flow-a:***')
>>> [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in creds.acl]   # 31: all five permissions
[('digest', 'flow-a', 31)]
>>> os.environ["TF_DOCTEST_ZK"] = "hunter2"
>>> credentials_from("env:TF_DOCTEST_ZK")
Traceback (most recent call last):
...
twinflow.secrets.SecretError: env:TF_DOCTEST_ZK must hold user:password for ZooKeeper
>>> credentials_from(None, environ={}) is None
True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions, make_digest_acl

from ..secrets import SecretError, read_secret

ZK_AUTH_ENV = "TWINFLOW_ZK_AUTH"

# The parent of every flow, whatever its credentials: anyone may list the
# flows, create one and delete an empty one. Nobody but a ZooKeeper super user
# may write it or change its ACL (no ADMIN), so no flow can lock the others
# out of it. DELETE cannot remove a protected flow: its root always has
# children (election, members, epoch, persistent), and only the flow's
# credentials may delete those.
PARENT_ACL = [ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, ANYONE_ID_UNSAFE)]


class ZkAccessDenied(RuntimeError):
    """ZooKeeper refused a call on a flow's znode (NoAuth): the credentials are missing or wrong."""

    def __init__(self, path: str, identity: str | None):
        self.path, self.identity = path, identity
        if identity is None:
            why = (f"the flow's znodes are protected by an ACL and this peer has no ZooKeeper "
                   f"credentials: authentication is needed; set {ZK_AUTH_ENV} to file:PATH or "
                   f"env:NAME holding user:password")
        else:
            why = (f"the flow's znodes are protected by an ACL that does not name this peer's "
                   f"credentials ({identity}): check {ZK_AUTH_ENV}")
        super().__init__(f"ZooKeeper refused access to {path}: {why}")


@dataclass(frozen=True)
class ZkCredentials:
    """A digest identity; ``repr`` and :attr:`redacted` show the user only."""

    name: str
    password: str = field(repr=False)

    @property
    def redacted(self) -> str:
        return f"{self.name}:***"

    @property
    def acl(self) -> list[ACL]:
        """All permissions for this identity, none for anyone else."""
        return [make_digest_acl(self.name, self.password, all=True)]

    def client_kwargs(self) -> dict:
        """What ``KazooClient`` needs to authenticate and to create every znode with :attr:`acl`
        (kazoo applies ``default_acl`` to ``create``, to each znode ``ensure_path`` makes and so
        to the Election/Lock recipe's queue nodes)."""
        return {
            "auth_data": [("digest", f"{self.name}:{self.password}")],
            "default_acl": self.acl,
            "logger": _redacting_logger(self.password),
        }

    def __repr__(self) -> str:
        return f"ZkCredentials(user={self.redacted!r})"


def credentials_from(ref: str | None, environ: Mapping[str, str] = os.environ) -> ZkCredentials | None:
    """The credentials ``ref`` names, else those ``TWINFLOW_ZK_AUTH`` names; None when neither is set."""
    ref = ref if ref is not None else environ.get(ZK_AUTH_ENV, "").strip()
    if not ref:
        return None
    name, colon, password = read_secret(ref).partition(":")
    if not (colon and name and password):
        raise SecretError(f"{ref} must hold user:password for ZooKeeper")
    return ZkCredentials(name, password)


def identity_of(zk) -> str | None:
    """The digest identity a kazoo client authenticates as, redacted (``user:***``), or None."""
    for scheme, auth in getattr(zk, "auth_data", ()) or ():
        if scheme == "digest":
            return f"{auth.partition(':')[0]}:***"
    return None


def describe_acl(acls) -> str:
    """An ACL as ``scheme:id:perms``, a digest's hash left out (it can be attacked offline)."""
    letters = ((Permissions.CREATE, "c"), (Permissions.DELETE, "d"), (Permissions.READ, "r"),
               (Permissions.WRITE, "w"), (Permissions.ADMIN, "a"))
    out = []
    for acl in acls:
        ident = acl.id.id.partition(":")[0] + ":***" if acl.id.scheme == "digest" else acl.id.id
        out.append(f"{acl.id.scheme}:{ident}:" + "".join(c for bit, c in letters if acl.perms & bit))
    return ",".join(out) or "(none)"


class _Redact(logging.Filter):
    """Takes a password out of a record before any handler sees it."""

    def __init__(self, secret: str):
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "***"), ()
        return True


def _redacting_logger(password: str) -> logging.Logger:
    # kazoo logs every request it sends at DEBUG, the digest Auth packet
    # included, password and all. A logger of our own, under "kazoo.client"
    # so that its levels and handlers still apply, filters it out.
    logger = logging.getLogger("kazoo.client.authenticated")
    if not any(isinstance(f, _Redact) and f.secret == password for f in logger.filters):
        logger.addFilter(_Redact(password))
    return logger
