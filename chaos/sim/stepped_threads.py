"""The threads of a simulated peer, as steps the schedule takes: a batch that runs ahead,
and the master's writers with COMMITs held in flight.

No thread runs: each call runs when the schedule gives it a turn, or when
someone waits for it, whichever comes first, so a seed replays one order.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .world import SimPeer


class _Pending(Future):
    """A call whose thread is the schedule's: it runs when given a turn (:meth:`run`) or
    when someone waits for it, whichever comes first."""

    def __init__(self, call: Callable[[], Any]):
        super().__init__()
        self._call: Callable[[], Any] | None = call

    def run(self) -> None:
        call, self._call = self._call, None
        if call is None:
            return
        try:
            self.set_result(call())
        except BaseException as exc:  # handed to whoever waits for it, as a thread's would be
            self.set_exception(exc)

    def result(self, timeout: float | None = None) -> Any:
        self.run()
        return super().result(timeout)


class _Inline(Executor):
    """The master's writer threads (``cluster.master_session``): each write runs at once, in the
    caller's thread, so virtual time stays deterministic."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        done = _Pending(lambda: fn(*args, **kwargs))
        done.run()
        return done


class SimWrites(Executor):
    """The master's writer threads, with COMMITs that overlap the next step's build.

    As the seed says (``Dims.overlap``), a write runs at once (as :class:`_Inline`) or is held
    in flight: it reaches Redis only when the loop waits for it, that is after the loop built
    the next step on the flow, which is the overlap ``master_session`` has with real threads.
    While it is held, before it reaches Redis or after (its reply on the way), the world may
    let something else happen (:meth:`World.interleave`): time passes, ZooKeeper is noticed,
    the other peer promotes, a shard task's other attempt runs, Redis fails over, the writer is
    killed. The order is the seed's; no thread runs."""

    def __init__(self, sim: "SimPeer"):
        self.sim = sim

    def submit(self, fn, /, *args, **kwargs) -> Future:
        world = self.sim.world
        if world.dims.overlap <= 0 or world.rng.random() >= world.dims.overlap:
            done = _Pending(lambda: fn(*args, **kwargs))
            done.run()
            return done
        sim = self.sim

        def held():
            world.interleave(sim, "before")
            out = fn(*args, **kwargs)
            world.interleave(sim, "after")
            return out

        return _Pending(held)


class AheadBatch(Executor):
    """A member's batch thread, stepped by the schedule (``cluster.batch_intake``, "Batches run
    ahead"): the batch runs at its own step, so the process can be killed after Spark
    committed it and before it ran, the window a real master has."""

    def __init__(self, sim: "SimPeer | None" = None) -> None:
        self.pending: _Pending | None = None
        self.sim = sim
        self.running = False  # the batch is running now (a kill inside it lands ahead of the checkpoint)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        def call():
            self.running = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.running = False

        self.pending = _Pending(call)
        return self.pending

    def run(self) -> str:
        """Run the batch waiting for its turn, if any; says what happened (for the trace)."""
        pending, self.pending = self.pending, None
        if pending is None or pending.done():
            return "nothing ahead"
        pending.run()
        exc = pending.exception()
        if exc is not None and self.sim is not None and isinstance(exc, Exception):
            self.sim.world.batch_failed(self.sim, exc)
        return "ran" if exc is None else f"failed ({type(exc).__name__}: {exc})"
