"""A priority queue of tuples that costs O(1) while items arrive in order (keys and deadlines mostly grow)."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Iterable


class MinQueue:
    """A priority queue of tuples that costs O(1) while items arrive in order.

    Keys and bake deadlines mostly grow: those items go to a sorted run (a
    deque); only an item below the run's tail pays for the heap. The smallest
    item is the smaller of the two fronts.
    """

    __slots__ = ("_run", "_heap")

    def __init__(self, items: Iterable[tuple] = ()):
        self._run = deque(sorted(items))
        self._heap: list[tuple] = []

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)

    def push(self, item: tuple) -> None:
        run = self._run
        if not run or item >= run[-1]:
            run.append(item)
        else:
            heapq.heappush(self._heap, item)

    def peek(self) -> tuple:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0]

    def pop(self) -> tuple:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)
        return run.popleft()

    def items(self) -> list[tuple]:
        """Every item, in no particular order."""
        return [*self._run, *self._heap]

    def pop_upto(self, limit: Any) -> list[tuple]:
        """Remove and return, smallest first, every item whose first field is at or below ``limit``."""
        out = []
        run, heap = self._run, self._heap
        while True:
            if heap and (not run or heap[0] < run[0]):
                if heap[0][0] > limit:
                    return out
                out.append(heapq.heappop(heap))
            elif run and run[0][0] <= limit:
                out.append(run.popleft())
            else:
                return out
