"""Redis for the simulator: fakeredis running the flow store's real Lua scripts, behind a link
per peer that the simulator can cut.

One :class:`fakeredis.FakeServer` per simulated run holds the flow's data;
each peer gets its own :class:`SimRedis` client on it, and its own
:class:`RedisLink`. A link fails in one of two ways, as a real network does:

- ``down``: every command raises ``ConnectionError`` before it reaches the
  server (nothing is applied);
- ``lost_replies``: the command is applied and then the reply is lost
  (``ConnectionError`` after the fact), so a retried write runs twice. The
  store's promise that every write is idempotent is what keeps this safe.

The server is always persistent and never evicts (``CONFIG GET`` answers
so). What it can lose is what a real Redis failover loses: with a
:class:`Replica`, the primary's writes reach the replica only when
replication catches up (a step the simulator takes) or when a client's
``WAIT`` asks for it; a failover makes the replica the primary, and every
write it had not received is gone (:meth:`Replica.failover`).

Time: fakeredis reads the wall clock for key expiry and for stream entry IDs
made by ``XADD *``. :func:`virtual_time` points both at the run's virtual
clock, so an ID cache entry expires ``id_ttl`` virtual seconds after its
COMMIT, as the same seed says, every time.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import time as _time
from contextlib import contextmanager
from typing import Callable

import fakeredis
import redis

from ...runtime.store import scripts


@functools.lru_cache(maxsize=4)
def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


CONFIG = {"maxmemory-policy": "noeviction", "appendonly": "yes", "save": ""}


class _VirtualTime:
    """Stands in for the ``time`` module in the fakeredis modules that read the clock."""

    def __init__(self) -> None:
        self.now: Callable[[], float] | None = None

    def time(self) -> float:
        return self.now() if self.now is not None else _time.time()

    def __getattr__(self, name: str):
        return getattr(_time, name)


_VIRTUAL = _VirtualTime()


@contextmanager
def virtual_time(now: Callable[[], float]):
    """fakeredis's clock (expiry, ``XADD *`` IDs) is ``now`` inside the block."""
    import fakeredis._socket._base as base
    import fakeredis.model._stream as stream

    saved = base.time, stream.time, stream.current_time, _VIRTUAL.now
    base.time = stream.time = _VIRTUAL
    stream.current_time = lambda: int(_VIRTUAL.time() * 1000)
    _VIRTUAL.now = now
    try:
        yield
    finally:
        base.time, stream.time, stream.current_time, _VIRTUAL.now = saved


class Replica:
    """The primary's one replica: a copy of its data as of the last time replication caught up.

    ``synced`` is what the replica holds; ``behind`` counts the primary's writes since (so a
    failover can say how many it lost). ``wait_works`` False breaks ``WAIT`` for a test:
    it answers that the replica has everything without copying anything."""

    def __init__(self, server: fakeredis.FakeServer):
        self.server = server
        self.synced: dict = {}
        self.behind = 0
        self.failovers = 0
        self.lost_writes = 0
        self.wait_works = True
        self.catch_up()

    def wrote(self) -> None:
        self.behind += 1

    def catch_up(self) -> None:
        db = self.server.dbs[0]
        db._remove_expired()
        self.synced = copy.deepcopy(db._dict)
        self.behind = 0

    def wait(self) -> int:
        """``WAIT 1 ms``: the replica has everything the primary has (the link is never cut here)."""
        if self.wait_works:
            self.catch_up()
        return 1

    def failover(self) -> int:
        """The replica becomes the primary: every write it had not received is gone. Returns how many."""
        lost = self.behind
        db = self.server.dbs[0]
        db._dict = copy.deepcopy(self.synced)
        db._expiry_heap = [(item.expireat, k) for k, item in db._dict.items() if item.expireat is not None]
        import heapq
        heapq.heapify(db._expiry_heap)
        self.behind = 0
        self.failovers += 1
        self.lost_writes += lost
        return lost


_READS = {"GET", "MGET", "EXISTS", "XRANGE", "XREVRANGE", "XLEN", "XINFO", "HGET", "HGETALL", "HMGET", "TTL",
          "PTTL", "PING", "SCAN", "KEYS", "SMEMBERS", "TYPE", "SCRIPT", "CONFIG"}


class RedisLink:
    """One peer's link to Redis: ``fault`` is None (up), ``"down"`` or ``"lost_replies"``."""

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
    may have left the flow since it last looked. ``cached_at`` records, per
    ID-cache key, the virtual time of the first COMMIT that wrote it, so
    that a checker can date an ID's entry into the cache even when the entry
    expired before any check looked."""

    def __init__(self, server: fakeredis.FakeServer, link: RedisLink, commits: list[int] | None = None,
                 replica: Replica | None = None, cached_at: dict[str, float] | None = None,
                 after_started: Callable[[], None] | None = None) -> None:
        super().__init__(server=server)
        # Called once a STARTED script (a history's "processing" entry) was applied and its reply
        # is on the way: the simulator may kill the writer there, inside its handler call.
        self.after_started = after_started
        self.link = link
        self.commits = commits if commits is not None else [0]
        self.replica = replica
        self.cached_at = cached_at if cached_at is not None else {}

    def _note_commit(self, args: tuple, result) -> None:
        """After an applied COMMIT: when each ID-cache key it wrote entered the cache."""
        if not isinstance(result, list) or not result or result[0] != 1:
            return
        numkeys = int(args[2])
        keys, argv = args[3:3 + numkeys], args[3 + numkeys:]
        n = int(argv[4])   # ARGV[5]: how many ID-cache keys follow the first four keys
        now = _VIRTUAL.time()
        for key in keys[4:4 + n]:
            self.cached_at.setdefault(key.decode() if isinstance(key, bytes) else str(key), now)

    def execute_command(self, *args, **options):
        what = str(args[0]) if args else "command"
        self.link.before(what)
        if what.upper() == "WAIT":
            result = self.replica.wait() if self.replica is not None else 0
            self.link.after(what)
            return result
        commit = what == "EVALSHA" and args[1] == _sha(scripts.ALL["commit"])
        if commit:
            self.commits[0] += 1
        if what == "EVALSHA" and args[1] == _sha(scripts.ALL["record_failure"]) and len(self.commits) > 1:
            self.commits[1] += 1
        result = super().execute_command(*args, **options)
        if commit:
            self._note_commit(args, result)
        if what == "EVALSHA" and args[1] == _sha(scripts.ALL["trim_uplink"]) and len(self.commits) > 2:
            self.commits[2] += int(result[0])  # uplink entries trimmed
        if self.replica is not None and what.upper() not in _READS:
            self.replica.wrote()
        self.link.after(what)
        if self.after_started is not None and what == "EVALSHA" and args[1] == _sha(scripts.ALL["started"]):
            self.after_started()
        return result

    def pipeline(self, transaction: bool = True, shard_hint=None):
        pipe = super().pipeline(transaction, shard_hint)
        execute, link, client = pipe.execute, self.link, self

        def linked_execute(raise_on_error: bool = True):
            link.before("pipeline")
            # WAIT is the replication model's (fakeredis has none): answered here, in its place.
            stack = pipe.command_stack
            waits = [i for i, c in enumerate(stack) if str(c[0][0]).upper() == "WAIT"]
            for i in reversed(waits):
                del stack[i]
            writes = any(str(c[0][0]).upper() not in _READS for c in stack)
            commit = _sha(scripts.ALL["commit"])
            client.commits[0] += sum(1 for c in stack if str(c[0][0]).upper() == "EVALSHA" and c[0][1] == commit)
            stack_sent = list(stack)
            if stack:
                sent = list(stack)   # execute() empties the stack
                result = list(execute(raise_on_error))
                for c, r in zip(sent, result):
                    if str(c[0][0]).upper() == "EVALSHA" and c[0][1] == commit:
                        client._note_commit(c[0], r)
                if client.replica is not None and writes:
                    client.replica.wrote()
            else:
                pipe.reset()
                result = []
            for i in waits:
                result.insert(i, client.replica.wait() if client.replica is not None else 0)
            link.after("pipeline")
            started = _sha(scripts.ALL["started"])
            if client.after_started is not None and any(
                    str(c[0][0]).upper() == "EVALSHA" and c[0][1] == started for c in stack_sent):
                client.after_started()
            return result

        pipe.execute = linked_execute
        return pipe

    def config_get(self, pattern: str = "*", *args, **kwargs):
        # fakeredis has no CONFIG; the model is a persistent, non-evicting Redis.
        self.link.before("CONFIG GET")
        return {pattern: CONFIG.get(pattern, "")}
