"""What a flow store's calls raise, and which Redis errors are worth waiting out.

It holds the store's exceptions (:class:`Fenced`, :class:`GuessWrong`, :class:`StaleState`,
:class:`StoreClosed`, :class:`RedisUnavailable`) and :func:`transient`. Under failure each
exception says what it leaves behind: a fenced write, a wrong guess and a stale state wrote
nothing; Redis unavailable past a call's deadline, or the store closed while a call waited,
lost nothing. ``transient`` is True only for the errors that waiting may cure.
"""

from __future__ import annotations

import redis

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# Errors a Redis answers with while it cannot take writes for now: out of
# memory (noeviction at maxmemory), a read-only replica after a failover, a
# master without its replicas. Waiting may cure them; nothing was written.
TRANSIENT_REPLIES = ("OOM", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "LOADING")

# redis-py strips the code off the replies it has a class for.
# MOVED: the flow's slot has a new owner on a Redis Cluster; the store reconnects there first.
TRANSIENT_ERRORS = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                    redis.exceptions.MasterDownError, redis.exceptions.TryAgainError,
                    redis.exceptions.ClusterDownError, redis.exceptions.MovedError)


class Fenced(RuntimeError):
    """A write carried an epoch older than the newest one; nothing was written."""

    def __init__(self, epoch: int, newest: int):
        super().__init__(f"epoch {epoch} is stale (newest is {newest}): write refused")
        self.epoch, self.newest = epoch, newest


class GuessWrong(RuntimeError):
    """A guarded commit found the processed mark moved or one of its IDs processed; nothing was written."""


class StaleState(GuessWrong):
    """A step was computed from a state version that is no longer the one in Redis (another
    writer committed since its flow was loaded); nothing was written: load the state again."""

    def __init__(self, version: int, in_force: int):
        super().__init__(f"the step was computed from state version {version}, Redis holds {in_force}")
        self.version, self.in_force = version, in_force


class StoreClosed(RuntimeError):
    """The store was closed while a call waited for Redis."""


class RedisUnavailable(RuntimeError):
    """Redis did not answer (or refused writes) for longer than the call's deadline; nothing was lost."""

    def __init__(self, what: str, waited_s: float, last: BaseException):
        super().__init__(f"Redis did not answer {what} for {waited_s:.1f} s: {last}")
        self.what, self.waited_s, self.last = what, waited_s, last


def transient(exc: BaseException) -> bool:
    """True for an error that waiting may cure (connection trouble, OOM, read-only, loading)."""
    if isinstance(exc, RETRYABLE + TRANSIENT_ERRORS):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(TRANSIENT_REPLIES)
