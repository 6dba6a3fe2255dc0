"""The simulation's event loop: :class:`~testbed._env.Environment` with a heap of plain tuples.

Same ordering (``(time, priority, sequence)``), same :class:`~testbed._env.Event` handles (so
``cancel`` works as before), same clock and counters. The heap holds ``(time, priority,
sequence, event)`` tuples, which compare in C (the sequence is unique, so the event itself is
never compared), and :meth:`run` pops and dispatches inline: this loop runs once per event of a
whole simulation.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from ._env import Environment, Event

__all__ = ["HeapEnvironment"]


class HeapEnvironment(Environment):
    """An :class:`Environment` whose queue is a heap of ``(time, priority, sequence, event)``."""

    __slots__ = ("_heap",)

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self._heap: list[tuple[float, int, int, Event]] = []

    def at(self, time: float, priority: int, callback: Callable[..., None], *args: Any) -> Event:
        if time < self.now:
            time = self.now
        seq = self._seq
        ev = Event(time, priority, seq, callback, args)
        self._seq = seq + 1
        heapq.heappush(self._heap, (time, priority, seq, ev))
        return ev

    def step(self) -> bool:
        q = self._heap
        while q:
            ev = heapq.heappop(q)[3]
            cb = ev.callback
            if cb is None:
                continue
            self.now = ev.time
            ev.callback = None
            self.processed += 1
            cb(*ev.args)
            return True
        return False

    def run(self, until: float | None = None) -> None:
        q = self._heap
        if until is not None:
            while q:
                if q[0][0] > until:
                    self.now = until
                    return
                self.step()
            return
        pop = heapq.heappop
        while q:
            ev = pop(q)[3]
            cb = ev.callback
            if cb is None:
                continue
            self.now = ev.time
            ev.callback = None
            self.processed += 1
            cb(*ev.args)

    def peek(self) -> float | None:
        return self._heap[0][0] if self._heap else None
