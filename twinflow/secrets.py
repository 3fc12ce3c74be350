"""Secrets from files or the environment, never from the command line, and never printed.

A secret is named by a reference, never given as its value, so that a flow
file can be committed and ``ps`` shows nothing worth stealing:

- ``file:PATH``: the file's content, stripped of surrounding whitespace
  (a trailing newline from ``echo`` is not part of the secret);
- ``env:NAME``: the environment variable ``NAME``.

:func:`read_secret` reads one secret (a password). :func:`read_tokens` reads a
list, one a line, for bearer tokens: during a rotation a file holds the new
token and the old one, and a server accepts each while a caller sends the first.

Under failure: a reference of another form, a missing or empty file, or an
unset or empty variable raises :class:`SecretError` naming the reference,
never the value. :func:`redact_url` takes the password out of a URL before
it reaches a log line, a status table or an error message.

>>> import os
>>> os.environ["TF_DOCTEST_TOKEN"] = "s3cret"
>>> read_secret("env:TF_DOCTEST_TOKEN")
's3cret'
>>> os.environ["TF_DOCTEST_TOKENS"] = "  new-token\\n\\n  old-token  \\n"
>>> read_tokens("env:TF_DOCTEST_TOKENS")
('new-token', 'old-token')
>>> read_secret("s3cret")
Traceback (most recent call last):
...
twinflow.secrets.SecretError: a secret must be named as file:PATH or env:NAME, not given as its value (got one starting 's3')
>>> redact_url("redis://app:hunter2@10.0.0.5:6379/0")
'redis://app:***@10.0.0.5:6379/0'
>>> redact_url("rediss://:hunter2@redis.example:6380")
'rediss://:***@redis.example:6380'
>>> redact_url("redis://127.0.0.1:6379/0")
'redis://127.0.0.1:6379/0'
"""

from __future__ import annotations

import os
import re
from pathlib import Path


class SecretError(ValueError):
    """A secret reference that cannot be read; the message never holds the secret."""


def read_secret(ref: str) -> str:
    """The secret ``ref`` names (``file:PATH`` or ``env:NAME``), non-empty."""
    return _read(ref).strip()


def read_tokens(ref: str) -> tuple[str, ...]:
    """The tokens ``ref`` names (``file:PATH`` or ``env:NAME``), one a line, in their order: at least
    one. Blank lines and the whitespace around each token are left out."""
    return tuple(line.strip() for line in _read(ref).splitlines() if line.strip())


def _read(ref: str) -> str:
    """What ``ref`` names, with something in it besides whitespace."""
    kind, _, where = ref.partition(":")
    if kind == "file" and where:
        try:
            value = Path(where).read_text()
        except OSError as exc:
            raise SecretError(f"secret file {where}: {exc.strerror or exc}") from None
        if not value.strip():
            raise SecretError(f"secret file {where} is empty")
        return value
    if kind == "env" and where:
        value = os.environ.get(where, "")
        if not value.strip():
            raise SecretError(f"environment variable {where} (a secret) is not set or empty")
        return value
    # Show only the start of what was given: enough to find it, too little to use it.
    raise SecretError(f"a secret must be named as file:PATH or env:NAME, not given as its value "
                      f"(got one starting {ref[:2]!r})")


_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/]*):(?P<password>[^@/]*)@")


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url, count=1)


def redact_text(text: str, *secrets: str | None) -> str:
    """``text`` with every URL password and each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    # Up to the last "@" before the host, so that an unencoded "@" or "/" in a password is hidden too.
    return re.sub(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:@/\s]*):(\S*)@", r"\1:***@", text)
