"""The engine's firing of deadlines before each message, with and without nodes that promise
to set their deadlines after the time they take a message at."""

from __future__ import annotations

from twinflow.runtime.engine import Engine
from twinflow.runtime.fields import FieldPath
from twinflow.runtime.flowgraph import FlowGraph
from twinflow.runtime.nodes.base import Emit, Msg, Node


class DueNow(Node):
    """Sets a deadline at the very time it takes a message (a time-out of 0): fires it as "late"."""

    kind = "due-now"
    outlinks = ("out", "late")

    def __init__(self, name: str, after_now: bool):
        super().__init__(name)
        self.sets_deadlines_after_now = after_now  # a false promise when True: for the test
        self.due: list[tuple[float, str]] = []
        self.asked = 0

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        self.due.append((now, msg.id))
        return [Emit("out", (msg,))]

    def on_time(self, now: float) -> list[Emit]:
        fired = [Msg(i, {}) for t, i in self.due if t <= now]
        self.due = [(t, i) for t, i in self.due if t > now]
        return [Emit("late", (m,)) for m in fired]

    def next_deadline(self) -> float | None:
        self.asked += 1
        return min((t for t, _ in self.due), default=None)


def run(after_now: bool) -> tuple[list[str], int]:
    node = DueNow("n", after_now)
    left: list[str] = []
    engine = Engine(FlowGraph(name="f", input="n", id_path=FieldPath("id"), nodes={"n": node}),
                    leave=lambda name, e, at: left.append(f"{e.outlink}:{e.msgs[0].id}"))
    for i in range(3):
        engine.feed(Msg(f"m{i}", {}), 5.0)
    return left, node.asked


def test_a_deadline_due_at_the_time_of_the_next_message_fires_before_it():
    left, asked = run(after_now=False)
    assert left == ["out:m0", "late:m0", "out:m1", "late:m1", "out:m2"]
    assert asked >= 3  # asked before each message


def test_nodes_that_set_deadlines_after_now_are_asked_once_per_time():
    # With the promise (broken on purpose here, to make it visible), the engine asks the nodes
    # once for the run of messages at 5.0, and the deadlines set at 5.0 wait for a later time.
    left, asked = run(after_now=True)
    assert left == ["out:m0", "out:m1", "out:m2"] and asked == 1
