"""Redis credentials and TLS settings from the environment, for every Redis client.

A Redis URL on a command line shows in ``ps``, so the password and the TLS
files can come from the environment instead; :func:`client_options` turns
them into redis-py keyword arguments, and ``redis_slot.client_from_url``
(which builds every flow client) applies them:

- ``TWINFLOW_REDIS_PASSWORD``: a secret reference (``file:PATH`` or
  ``env:NAME``, see :mod:`twinflow.secrets`), the password of the URL's user
  (``redis://app@host:6379/0``, a Redis 6+ ACL user) or of ``default``
  (``redis://host:6379/0``, ``requirepass``). A password in the URL itself
  wins: it is the more specific setting.
- ``TWINFLOW_REDIS_CA``: a CA PEM file that signed the server's certificate;
- ``TWINFLOW_REDIS_CERT`` / ``TWINFLOW_REDIS_KEY``: this client's certificate
  and key, for a Redis with ``tls-auth-clients yes``.

- ``TWINFLOW_REDIS_SENTINEL_PASSWORD``: with a ``redis+sentinel://`` URL, a
  secret reference to the password the Sentinels ask for (``requirepass`` in
  sentinel.conf), when they ask for one; the URL's and
  ``TWINFLOW_REDIS_PASSWORD``'s password is the primary's. The Sentinels get
  the same TLS files as the primary (``rediss+sentinel://``).

The TLS variables need a ``rediss://`` URL: set with ``redis://`` they raise,
since the client would otherwise talk in clear text to a server the operator
meant to reach over TLS. Nothing here talks to Redis: AUTH goes with each
new connection's handshake, as redis-py sends it.

Under failure: an unreadable secret, a missing TLS file, TLS variables
with a ``redis://`` URL or a URL password that would be parsed wrongly
raise :class:`RedisSettingsError` (a ``ValueError``) at once, naming the
variable and never the password. :func:`scrub` takes the
passwords out of a text (an error from redis-py) before it is logged, and
:func:`connect_error` also says whether a refused client gave a password.

>>> client_options("redis://127.0.0.1:6379/0", environ={})
{}
>>> import os
>>> os.environ["TF_DOCTEST_REDIS_PW"] = "hunter2"
>>> client_options("redis://app@127.0.0.1:6379/0", environ={"TWINFLOW_REDIS_PASSWORD": "env:TF_DOCTEST_REDIS_PW"})
{'password': 'hunter2'}
>>> client_options("redis://127.0.0.1:6379/0", environ={"TWINFLOW_REDIS_CA": "/etc/ca.pem"})
Traceback (most recent call last):
...
twinflow.runtime.store.redis_auth.RedisSettingsError: TWINFLOW_REDIS_CA is set but redis://127.0.0.1:6379/0 is not a rediss:// URL (TLS)
>>> scrub("AUTH failed for redis://app:hunter2@h:6379 (hunter2)", "redis://app:hunter2@h:6379")
'AUTH failed for redis://app:***@h:6379 (***)'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from twinflow.secrets import SecretError, read_secret, redact_text, redact_url

ENV_PASSWORD = "TWINFLOW_REDIS_PASSWORD"
ENV_CA = "TWINFLOW_REDIS_CA"
ENV_CERT = "TWINFLOW_REDIS_CERT"
ENV_KEY = "TWINFLOW_REDIS_KEY"
ENV_SENTINEL_PASSWORD = "TWINFLOW_REDIS_SENTINEL_PASSWORD"
TLS_SCHEMES = ("rediss", "rediss+sentinel")

# Environment variable -> redis-py SSLConnection argument.
_TLS_FILES = {ENV_CA: "ssl_ca_certs", ENV_CERT: "ssl_certfile", ENV_KEY: "ssl_keyfile"}


class RedisSettingsError(ValueError):
    """The Redis settings in the environment cannot be used; the message holds no password."""


def client_options(url: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """redis-py keyword arguments that the environment adds to ``url`` (see module)."""
    env = os.environ if environ is None else environ
    _check_userinfo(url)
    options: dict[str, Any] = {}
    ref = env.get(ENV_PASSWORD, "").strip()
    if ref and not _url_password(url):
        try:
            options["password"] = read_secret(ref)
        except SecretError as exc:
            raise RedisSettingsError(f"{ENV_PASSWORD}: {exc}") from None
    files = {name: env[name] for name in _TLS_FILES if env.get(name, "").strip()}
    if files and urlsplit(url).scheme.lower() not in TLS_SCHEMES:
        raise RedisSettingsError(f"{', '.join(files)} {'is' if len(files) == 1 else 'are'} set but "
                                 f"{redact_url(url)} is not a rediss:// URL (TLS)")
    if (ENV_CERT in files) != (ENV_KEY in files):
        raise RedisSettingsError(f"{ENV_CERT} and {ENV_KEY} go together (a client certificate and its key)")
    for name, path in files.items():
        # Checked here, once: a missing file found by the TLS handshake would be
        # retried as if Redis were down until the connect deadline.
        if not Path(path).is_file():
            raise RedisSettingsError(f"{name}: no file {path}")
        options[_TLS_FILES[name]] = path
    return options


def sentinel_options(url: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """redis-py keyword arguments for the connections to the Sentinels themselves (their password)."""
    env = os.environ if environ is None else environ
    ref = env.get(ENV_SENTINEL_PASSWORD, "").strip()
    if not ref:
        return {}
    try:
        return {"password": read_secret(ref)}
    except SecretError as exc:
        raise RedisSettingsError(f"{ENV_SENTINEL_PASSWORD}: {exc}") from None


def scrub(text: str, url: str, options: Mapping[str, Any] | None = None) -> str:
    """``text`` without the password of ``url`` or of ``options`` (as :func:`client_options` gave)."""
    raw = _url_password(url)
    return redact_text(text, raw, unquote(raw) if raw else None, (options or {}).get("password"))


def connect_error(exc: Exception, url: str, options: Mapping[str, Any] | None = None) -> Exception:
    """``exc`` as a caller may log it: without any password (see :func:`scrub`), and when Redis
    refused the credentials, saying which were given (redis-py's own text does not)."""
    import redis

    text = scrub(str(exc), url, options)
    if isinstance(exc, redis.AuthenticationError):
        given = _url_password(url) or (options or {}).get("password")
        text += (" (Redis refused the user or password given)" if given else
                 f" (Redis wants a password, none was given: set {ENV_PASSWORD} to file:PATH or env:NAME)")
    if text == str(exc):
        return exc
    try:
        clean = type(exc)(text)
    except Exception:  # a type whose constructor takes other arguments
        clean = None
    return clean if clean is not None and str(clean) == text else redis.RedisError(text)


def _check_userinfo(url: str) -> None:
    """Raise when ``url``'s user or password holds a character that ends the host part
    (``/ ? #``): the URL would be parsed with a piece of the password as its host or port,
    and the parsing errors echo that piece, past :func:`scrub` (which knows the whole
    password). Or an ``@``: ``redact_url`` would hide only the part before it."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return
    userinfo = rest.rpartition("@")[0]
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        netloc = ""
    if "@" in userinfo or userinfo != netloc.rpartition("@")[0]:
        raise RedisSettingsError(f"the {scheme}:// URL's user or password holds a character that must be "
                                 f"percent-encoded (/ ? # @ as %2F %3F %23 %40), or give the password "
                                 f"in {ENV_PASSWORD}")


def _url_password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:  # not a URL urlsplit can take apart: nothing to add, redis-py will say why
        return None
