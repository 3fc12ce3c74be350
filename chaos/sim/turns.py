"""Threads that take turns: a simulated peer's own threads (its election loop, its member
keeper, its ZooKeeper client's event thread) run one at a time, when the simulator says.

Each :class:`SimThread` is an OS thread, but of all the threads of one :class:`Turns` (one
simulated world) only one runs at any moment: a thread runs until it waits (a
:class:`SimEvent`, a :class:`SimLock`, a sleep, a join) and then hands the turn back to
whoever gave it. A wait is a condition and, if it has a time-out, a deadline on the virtual
clock. :meth:`Turns.run` gives turns, in the order the threads were started, to every thread
whose condition holds or whose deadline has passed, until none is left: so a seed replays
one order, and time passes only when the simulator moves the clock. The simulator's own
thread waits by driving (:meth:`Turns.wait_for`): it runs the threads, and when none can run
it moves the clock to the next deadline.

:class:`PeerThreads` is what one process has: the names of ``threading`` and ``time`` that
``cluster.leadership.Threads`` stands for, and the threads started through it.

Under failure: :meth:`PeerThreads.kill` (the process killed, or stopped) makes every wait of
its threads raise :class:`ThreadKilled` (a BaseException, so the peer code's handlers let it
through): their OS threads end, and none of them runs again. A thread that ends with any
other exception is recorded in ``Turns.errors`` (the run fails on it), as a real thread
would print its traceback and die.
"""

from __future__ import annotations

import itertools
import threading
import traceback
from typing import Callable

MAX_TURNS = 20_000   # turns one run() may give: past that the threads spin without waiting


class ThreadKilled(BaseException):
    """The process this thread belongs to is gone: the thread goes no further."""


class SimulationSpins(BaseException):
    """Threads kept running without ever waiting (a BaseException, as SimulationStuck)."""


class SimThread:
    """``threading.Thread``'s interface, for a thread that runs only when given a turn."""

    def __init__(self, owner: "PeerThreads", target: Callable[..., None], name: str = "", args: tuple = (),
                 kwargs: dict | None = None, daemon: bool = True):
        self.owner, self.turns = owner, owner.turns
        self.name = name or getattr(target, "__name__", "thread")
        self.daemon = daemon
        self._target = lambda: target(*args, **(kwargs or {}))
        self.ident: int | None = None
        self.done = False
        self._go = threading.Event()      # this OS thread's turn (also: a turn it gave came back)
        self._back: threading.Event | None = None  # whoever gave the current turn
        self._os: threading.Thread | None = None
        self._parked = True               # waiting for a turn (not running, not giving one)
        self._ready: Callable[[], bool] = lambda: True
        self._deadline: float | None = None

    def start(self) -> None:
        self.ident = next(self.turns.idents)
        self.owner.threads.append(self)
        if self.owner.killed:
            self.done = True

    def is_alive(self) -> bool:
        return self.ident is not None and not self.done

    def join(self, timeout: float | None = None) -> None:
        self.turns.wait_for(lambda: self.done, timeout)

    # -- the turns ----------------------------------------------------------
    def runnable(self) -> bool:
        if self.ident is None or self.done or not self._parked:
            return False
        if self.owner.killed:
            return True
        if self._deadline is not None and self.turns.now() >= self._deadline:
            return True
        return self._ready()

    def _main(self) -> None:
        try:
            if not self.owner.killed:
                self._target()
        except (ThreadKilled, SimulationSpins):
            pass
        except BaseException as exc:  # a real thread dies with its traceback printed
            if not self.owner.killed and type(exc).__name__ != "Killed":
                self.turns.errors.append(f"thread {self.name} of {self.owner.name} died: "
                                         f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self.done = True
            self._parked = True
            back, self._back = self._back, None
            back.set()

    def park(self, ready: Callable[[], bool], deadline: float | None) -> None:
        """Wait (this thread's own call): hand the turn back until ``ready()`` or the deadline."""
        if self.owner.killed:
            raise ThreadKilled(self.name)
        self._ready, self._deadline = ready, deadline
        self._parked = True
        self._go.clear()
        back, self._back = self._back, None
        back.set()
        self._go.wait()
        self._go.clear()
        if self.owner.killed:
            raise ThreadKilled(self.name)


class Turns:
    """The turns of one world's threads; ``now`` is its virtual clock and ``advance(s)`` moves it
    (the world's ``wait``: time passes for everyone, faults heal, sessions expire)."""

    def __init__(self, now: Callable[[], float], advance: Callable[[float], None]):
        self.now, self.advance = now, advance
        self.current: SimThread | None = None   # the thread running now (None: the simulator's own)
        self.peers: list[PeerThreads] = []
        self.errors: list[str] = []
        self.idents = itertools.count(1)
        self._main_go = threading.Event()

    def _give(self, thread: SimThread) -> None:
        """Run ``thread`` until it waits or ends; the caller's own turn then goes on."""
        caller = self.current
        back = caller._go if caller is not None else self._main_go
        back.clear()
        thread._back = back
        thread._parked = False
        self.current = thread
        if thread._os is None:
            thread._os = threading.Thread(target=thread._main, name=f"sim-{thread.owner.name}-{thread.name}",
                                          daemon=True)
            thread._os.start()
        else:
            thread._go.set()
        back.wait()
        back.clear()
        self.current = caller

    def run(self, peers: "list[PeerThreads] | None" = None) -> int:
        """Give turns until no thread of ``peers`` (default: every peer's) can run; returns how many."""
        given = 0
        while True:
            thread = next((t for p in (peers if peers is not None else self.peers) for t in p.threads
                           if t.runnable()), None)
            if thread is None:
                return given
            given += 1
            if given > MAX_TURNS:
                raise SimulationSpins(f"threads took {MAX_TURNS} turns without all waiting "
                                      f"(last: {thread.name} of {thread.owner.name})")
            self._give(thread)

    def pending(self, peers: "list[PeerThreads]") -> bool:
        return any(t.runnable() for p in peers for t in p.threads)

    def wait_for(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``ready()`` or ``timeout`` virtual seconds: a thread parks; the simulator's
        own thread drives, running every thread and moving the clock to the next deadline."""
        deadline = None if timeout is None or timeout < 0 else self.now() + timeout
        me = self.current
        if me is not None:
            while not ready():
                if deadline is not None and self.now() >= deadline:
                    return False
                me.park(ready, deadline)
            return True
        while True:
            if ready():
                return True
            self.run()
            if ready():
                return True
            now = self.now()
            if deadline is not None and now >= deadline:
                return False
            due = [t._deadline for p in self.peers for t in p.threads
                   if t._deadline is not None and t.is_alive() and t._parked]
            later = [d for d in due if d > now] + ([deadline] if deadline is not None else [])
            if not later:
                raise SimulationSpins("a wait with no time-out that nothing can end")
            self.advance(max(min(later) - now, 0.001))


class SimEvent:
    """``threading.Event`` for threads that take turns."""

    def __init__(self, turns: Turns):
        self.turns = turns
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        self.turns.wait_for(self.is_set, timeout)
        return self._flag


class SimLock:
    """``threading.Lock`` (``acquire(blocking, timeout)``, ``release``, ``with``) for threads that take
    turns: a thread that finds it held waits for its turn, the simulator's own thread drives."""

    def __init__(self, turns: Turns):
        self.turns = turns
        self._held = False

    def locked(self) -> bool:
        return self._held

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._held:
            if not blocking or not self.turns.wait_for(lambda: not self._held, timeout):
                return False
        self._held = True
        return True

    def release(self) -> None:
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self._held = False

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class PeerThreads:
    """One process's threads, events, locks and time (``cluster.leadership.Threads``'s names)."""

    def __init__(self, turns: Turns, name: str):
        self.turns, self.name = turns, name
        self.threads: list[SimThread] = []
        self.killed = False
        turns.peers.append(self)

    def Thread(self, target: Callable[..., None], name: str = "", args: tuple = (),  # noqa: N802
               kwargs: dict | None = None, daemon: bool = True) -> SimThread:
        return SimThread(self, target, name, args, kwargs, daemon)

    def Event(self) -> SimEvent:  # noqa: N802
        return SimEvent(self.turns)

    def Lock(self) -> SimLock:  # noqa: N802
        return SimLock(self.turns)

    def monotonic(self) -> float:
        return self.turns.now()

    def sleep(self, seconds: float) -> None:
        self.turns.wait_for(lambda: False, max(seconds, 0.0))

    def spawn(self, func: Callable[..., None], *args, **kwargs) -> SimThread:
        t = self.Thread(func, getattr(func, "__name__", "spawned"), args, kwargs)
        t.start()
        return t

    def run(self) -> int:
        """Give this process's threads turns until none can run."""
        return self.turns.run([self])

    def pending(self) -> bool:
        return self.turns.pending([self])

    def kill(self) -> None:
        """The process is gone: each of its threads ends at its next wait (one waiting now, at once)."""
        if self.killed:
            return
        self.killed = True
        for t in list(self.threads):
            if t._os is None:
                t.done = True
            elif not t.done and t._parked and t is not self.turns.current:
                self.turns._give(t)
        if self in self.turns.peers:
            self.turns.peers.remove(self)
