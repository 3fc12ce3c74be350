"""Every key under one prefix copied at one instant while its writers run, and put back.

:func:`copy_keys` holds every write on the Redis with ``CLIENT PAUSE <bound> WRITE``, then
lists and reads the prefix's keys (``SCAN``, ``DUMP``, ``PTTL``) in batches, each batch one
read-only script (``#!lua flags=no-writes``, which the pause lets through: a script that may
write waits), and ends the pause. Redis runs one command at a time, so every script and
``MULTI`` block of a writer ran before the pause or runs after it, whole: the copy is the
state between two of them, the state a crash of every writer at that instant would have
left. (A pipeline of separate commands may be caught between two of them, as such a crash
could leave it.) The writers' commands wait and then run; nothing is refused or dropped.
Keys whose time to live ends during the pause read as gone, as they would at its end
(Redis holds expiry back during a pause, but a key past its time is not returned).

What it costs: the pause lasts as long as the copy, about 3 µs per key of the prefix and
1 µs per other key of the Redis (``SCAN`` walks them all), measured on a local Redis 7.0:
50,000 keys alone in 150 ms, beside 500,000 others in 500 ms, 500,000 keys in 1.7 s.
The copy is held in memory.

Under failure:

- the pause is bounded by Redis itself (its ``CLIENT PAUSE`` timeout): a copier that dies
  or hangs holds the writers up to the bound, never longer;
- a copy that would outlast the bound is abandoned (:class:`PauseOverrun`): past it the
  writers run again, and what is read after that instant would mix two states. The bound
  is checked against this process's clock from before the pause was asked for, so an
  answer received within it was read inside the pause;
- a Redis that refuses ``CLIENT PAUSE`` (before 7.0, or an ACL or a managed service that
  forbids it) raises :class:`CannotPause`, having held nothing.

:func:`restore_keys` writes keys back (``RESTORE ... REPLACE``, with the time to live they
had left) in pipelined batches; :func:`delete_keys` removes a prefix's keys. Neither is
atomic: the caller marks the work as under way (``cluster/flow_restore.py``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import redis

BATCH = 1000            # keys a SCAN of the copy asks for at a time (a script's run: a few ms)
RESTORE_BATCH = 500     # RESTOREs in one pipelined round trip
MIN_REDIS = (7, 0)      # scripts flagged no-writes, which a CLIENT PAUSE WRITE lets through

# COPY_BATCH: one SCAN step of the copy, read-only, so that CLIENT PAUSE WRITE lets it through.
# No KEYS. ARGV[1] the SCAN cursor, ARGV[2] the MATCH pattern, ARGV[3] the COUNT.
# Returns {next cursor, key, PTTL, DUMP payload, key, PTTL, payload, ...}; a key that reads as
# gone (its time to live ended) is left out.
COPY_BATCH = """#!lua flags=no-writes
local found = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local out = {found[1]}
for _, key in ipairs(found[2]) do
  local payload = redis.call('DUMP', key)
  if payload then
    out[#out + 1] = key
    out[#out + 1] = redis.call('PTTL', key)
    out[#out + 1] = payload
  end
end
return out
"""


class CannotPause(RuntimeError):
    """This Redis cannot hold its writes for a copy (too old, or CLIENT PAUSE not allowed)."""


class PauseOverrun(RuntimeError):
    """The copy did not end within the pause's bound: abandoned, since it would mix two states."""

    def __init__(self, bound_ms: int, copied: int):
        self.bound_ms, self.copied = bound_ms, copied
        super().__init__(f"the copy did not end within the pause's bound of {bound_ms} ms ({copied:,} keys "
                         f"read by then)")


@dataclass
class KeyCopy:
    """What :func:`copy_keys` read: each key as (key, PTTL in ms or -1, DUMP payload), the Redis
    time of the copy (ms), how long the writes were held (ms, as this process measured it, from
    asking for the pause to the answer that ended it), the Redis version, and the replies of the
    caller's ``also`` reads, made under the same pause."""

    records: list[tuple[bytes, int, bytes]]
    redis_time_ms: int
    pause_ms: float
    redis_version: str
    also: list = field(default_factory=list)


def pattern(prefix: str) -> str:
    """``prefix`` as a SCAN MATCH pattern for every key that starts with it.

    >>> pattern("tf:{orders}:")
    'tf:{orders}:*'
    >>> pattern("a*b[")
    'a\\\\*b\\\\[*'
    """
    return re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"


def redis_version(client: redis.Redis) -> str:
    return str(client.info("server")["redis_version"])


def version_tuple(version: str) -> tuple[int, ...]:
    """The numbers of a Redis version, to compare.

    >>> version_tuple("7.0.15") >= (7, 0)
    True
    """
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def copy_keys(client: redis.Redis, prefix: str, bound_ms: int, *,
              also: Callable[[redis.client.Pipeline], None] | None = None,
              monotonic: Callable[[], float] = time.monotonic) -> KeyCopy:
    """Every key of ``prefix`` at one instant, read under a pause of at most ``bound_ms`` (see
    the module doc); ``also(pipe)`` queues further reads made under the same pause."""
    version = redis_version(client)
    if version_tuple(version) < MIN_REDIS:
        raise CannotPause(f"Redis {version} cannot hold its writes while the copy's scripts read (needs "
                          f"{'.'.join(map(str, MIN_REDIS))} or newer)")
    match = pattern(prefix)
    records: list[tuple[bytes, int, bytes]] = []
    began = monotonic()
    try:
        client.execute_command("CLIENT", "PAUSE", int(bound_ms), "WRITE")
    except redis.ResponseError as exc:
        raise CannotPause(f"this Redis refuses CLIENT PAUSE ({exc})") from None

    def within() -> None:
        if (monotonic() - began) * 1000 >= bound_ms:
            raise PauseOverrun(int(bound_ms), len(records))

    try:
        pipe = client.pipeline(transaction=False)
        pipe.time()
        if also is not None:
            also(pipe)
        (seconds, micros), *extra = pipe.execute()
        cursor = b"0"
        while True:
            within()
            reply = client.eval(COPY_BATCH, 0, cursor, match, BATCH)
            cursor = reply[0]
            body = reply[1:]
            records += [(body[i], int(body[i + 1]), body[i + 2]) for i in range(0, len(body), 3)]
            if cursor in (b"0", "0", 0):
                break
        within()  # the last answer too came before the pause's end
    finally:
        try:
            client.execute_command("CLIENT", "UNPAUSE")
        except redis.RedisError:
            pass  # Redis ends the pause at its bound all the same
    return KeyCopy(records, seconds * 1000 + micros // 1000, (monotonic() - began) * 1000, version, extra)


def restore_keys(client: redis.Redis, records: Iterable[tuple[bytes, int, bytes]],
                 batch: int = RESTORE_BATCH) -> int:
    """``RESTORE`` each (key, PTTL, payload) with the time to live it had left, replacing a key
    of that name; returns how many. Raises on the first refused one (an older Redis that cannot
    read the payload, memory full), the keys before it restored."""
    done = 0
    pipe = client.pipeline(transaction=False)
    for key, pttl, payload in records:
        pipe.restore(key, max(pttl, 0), payload, replace=True)  # 0: no time to live
        if len(pipe) >= batch:
            done += len(pipe.execute())
    if len(pipe):
        done += len(pipe.execute())
    return done


def list_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    """Every key of ``prefix`` (SCAN: a key written meanwhile may or may not be in it)."""
    return list(client.scan_iter(match=pattern(prefix), count=BATCH))


def delete_keys(client: redis.Redis, prefix: str, keep: Iterable[str] = ()) -> int:
    """Remove every key of ``prefix`` but those in ``keep``; returns how many."""
    kept = {k.encode() for k in keep}
    gone = [k for k in list_keys(client, prefix) if k not in kept]
    for at in range(0, len(gone), BATCH):
        client.unlink(*gone[at:at + BATCH])
    return len(gone)
