"""Where a master's COMMITs are sent from: this process's writer threads.

A master session sends each step's COMMIT from one of these threads, so that the batch thread
builds the next step meanwhile (``master_session.STEPS_IN_FLIGHT``). Under failure: a forked
child (a Spark worker) gets a pool of its own, since threads do not follow a fork; what a
COMMIT raises comes back through its future to the session that sent it.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, ThreadPoolExecutor

_pool: tuple[int, ThreadPoolExecutor] | None = None


def write_pool() -> Executor:
    """This process's writer threads (made again in a forked child, where threads do not follow)."""
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="twinflow-commit"))
    return _pool[1]
