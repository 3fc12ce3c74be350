"""The Redis Stream source's format name and its options' defaults, and how an integer option
is read (the options themselves are described in ``source.py``).

Under failure: an integer option below its least value refuses the reader at once, with a
``ValueError`` naming the option, before anything is read.
"""

from __future__ import annotations

SOURCE_NAME = "twinflow_redis_stream"
DEFAULT_BATCH_SIZE = 2000
DEFAULT_BATCH_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_CONNECT_DEADLINE_S = 300.0
DEFAULT_BLOCK_MS = 100


def _int_option(options: dict, name: str, default: int, least: int) -> int:
    value = int(options.get(name) or default)
    if value < least:
        raise ValueError(f"{SOURCE_NAME}: {name} must be >= {least}, got {value}")
    return value
