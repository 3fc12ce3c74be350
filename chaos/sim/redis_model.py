"""Redis for the simulator: fakeredis running the flow store's real Lua scripts, behind a link
per node that the simulator can cut.

One :class:`fakeredis.FakeServer` per simulated run holds the flow's data;
each node gets its own :class:`SimRedis` client on it, and its own
:class:`RedisLink`. A link fails in one of two ways, as a real network does:

- ``down``: every command raises ``ConnectionError`` before it reaches the
  server (nothing is applied);
- ``lost_replies``: the command is applied and then the reply is lost
  (``ConnectionError`` after the fact), so a retried write runs twice. The
  store's promise that every write is idempotent is what keeps this safe.

The server is always persistent and never evicts (``CONFIG GET`` answers
so): a Redis that loses its data is outside the promises (README "Redis
configuration") and outside this model.
"""

from __future__ import annotations

import functools
import hashlib

import fakeredis
import redis

from ...runtime.store import scripts


@functools.lru_cache(maxsize=4)
def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


CONFIG = {"maxmemory-policy": "noeviction", "appendonly": "yes", "save": ""}


class RedisLink:
    """One node's link to Redis: ``fault`` is None (up), ``"down"`` or ``"lost_replies"``."""

    def __init__(self) -> None:
        self.fault: str | None = None

    def before(self, what: str) -> None:
        if self.fault == "down":
            raise redis.ConnectionError(f"simulated: Redis unreachable ({what})")

    def after(self, what: str) -> None:
        if self.fault == "lost_replies":
            raise redis.ConnectionError(f"simulated: reply to {what} lost")


class SimRedis(fakeredis.FakeRedis):
    """A fakeredis client whose commands and pipelines go through a :class:`RedisLink`.

    ``commits`` counts the COMMIT scripts this client ran (only COMMIT writes
    a flow's outputs), so that a checker can tell cheaply whether anything
    may have left the flow since it last looked."""

    def __init__(self, server: fakeredis.FakeServer, link: RedisLink, commits: list[int] | None = None) -> None:
        super().__init__(server=server)
        self.link = link
        self.commits = commits if commits is not None else [0]

    def execute_command(self, *args, **options):
        what = str(args[0]) if args else "command"
        self.link.before(what)
        if what == "EVALSHA" and args[1] == _sha(scripts.ALL["commit"]):
            self.commits[0] += 1
        result = super().execute_command(*args, **options)
        self.link.after(what)
        return result

    def pipeline(self, transaction: bool = True, shard_hint=None):
        pipe = super().pipeline(transaction, shard_hint)
        execute, link = pipe.execute, self.link

        def linked_execute(raise_on_error: bool = True):
            link.before("pipeline")
            result = execute(raise_on_error)
            link.after("pipeline")
            return result

        pipe.execute = linked_execute
        return pipe

    def config_get(self, pattern: str = "*", *args, **kwargs):
        # fakeredis has no CONFIG; the model is a persistent, non-evicting Redis.
        self.link.before("CONFIG GET")
        return {pattern: CONFIG.get(pattern, "")}
