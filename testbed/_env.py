"""The event loop: one environment owns the virtual clock.

Events are ordered by ``(time, priority, sequence)``; the sequence counter lives on the
instance (never the class), so two environments in one process never influence each other and
a run is reproducible from its seed alone. Nothing here is global: a later asyncio live mode can
create as many environments as it likes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["Environment", "Event", "PRIO_STEP", "PRIO_TELEMETRY", "PRIO_ARRIVAL", "PRIO_TIMEOUT"]

PRIO_STEP = 0
"""Replica step completions run first at a given instant, so state is current for others."""
PRIO_TELEMETRY = 1
"""Telemetry polls see the state after the steps that ended at the same instant."""
PRIO_ARRIVAL = 2
"""Request arrivals and routing decisions see telemetry taken at the same instant."""
PRIO_TIMEOUT = 3
"""Client timeouts come last."""


class Event:
    """A scheduled callback; :meth:`cancel` makes it a no-op (lazy deletion from the heap)."""

    __slots__ = ("time", "priority", "seq", "callback", "args")

    def __init__(
        self, time: float, priority: int, seq: int, callback: Callable[..., None], args: tuple[Any, ...]
    ) -> None:
        self.time = time
        self.priority = priority
        self.seq = seq
        self.callback: Callable[..., None] | None = callback
        self.args = args

    def cancel(self) -> None:
        self.callback = None

    @property
    def cancelled(self) -> bool:
        return self.callback is None

    def __lt__(self, other: Event) -> bool:
        return (self.time, self.priority, self.seq) < (other.time, other.priority, other.seq)


class Environment:
    """Owns the clock (``now``, seconds of virtual time) and the event queue."""

    __slots__ = ("now", "_queue", "_seq", "processed")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._queue: list[Event] = []
        self._seq = 0
        self.processed = 0

    def at(self, time: float, priority: int, callback: Callable[..., None], *args: Any) -> Event:
        """Schedule ``callback(*args)`` at absolute virtual time ``time`` (not before now)."""
        if time < self.now:
            time = self.now
        ev = Event(time, priority, self._seq, callback, args)
        self._seq += 1
        heapq.heappush(self._queue, ev)
        return ev

    def after(self, delay: float, priority: int, callback: Callable[..., None], *args: Any) -> Event:
        """Schedule ``callback(*args)`` ``delay`` seconds from now."""
        return self.at(self.now + delay, priority, callback, *args)

    def step(self) -> bool:
        """Run the next live event; False when the queue is empty."""
        q = self._queue
        while q:
            ev = heapq.heappop(q)
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
        """Run events until the queue is empty (or the next event is later than ``until``)."""
        q = self._queue
        while q:
            if until is not None and q[0].time > until:
                self.now = until
                return
            self.step()

    def peek(self) -> float | None:
        """Time of the next queued event (cancelled ones included), or None."""
        return self._queue[0].time if self._queue else None
