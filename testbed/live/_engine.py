"""The testbed replica model driven in scaled real time by an asyncio task.

``LiveEngine`` owns one :class:`~testbed._env.Environment` and one
:class:`~testbed._replica.Replica`. Virtual time runs ``1 / time_scale`` times faster than the
wall clock: with ``time_scale=0.05`` a 200 ms prefill takes 10 ms. One driver task sleeps until the
next replica event is due in real time and runs the environment up to "now"; a request handler
first brings the environment up to now (:meth:`LiveEngine.advance`), then submits. Everything runs
on the event loop of the server that owns the engine: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from .._config import CostModel, ReplicaConfig
from .._env import Environment
from .._replica import DONE, RUNNING, Replica, Seq, Snapshot
from .._requests import Request

__all__ = ["LiveEngine", "LiveSeq"]


@dataclass(slots=True)
class LiveSeq:
    """One request on a live engine: the model's ``Seq`` plus wake-ups for its handler."""

    seq: Seq = None  # type: ignore[assignment]  # set right after Replica.submit
    first: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class LiveEngine:
    """A replica model in scaled real time. Create and use it on one event loop."""

    def __init__(self, replica_id: str, cfg: ReplicaConfig, cost: CostModel, *,
                 time_scale: float = 0.05) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        cfg.validate()
        self.time_scale = time_scale
        self.env = Environment()
        self.replica = Replica(0, replica_id, cfg, cost, self.env, self._on_finish,
                               self._on_first_token)
        self._live: dict[str, LiveSeq] = {}
        self._mono0 = time.monotonic()
        self._wall0_ns = time.time_ns()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # vLLM counters (tokens), reported on /metrics
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}

    # ---------------------------------------------------------------- clocks
    def vnow(self) -> float:
        """Virtual seconds now."""
        return (time.monotonic() - self._mono0) / self.time_scale

    def wall_ns(self, v: float) -> int:
        """Unix ns (this host's clock) of virtual time ``v``."""
        return self._wall0_ns + int(v * self.time_scale * 1e9)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the driver task (call from the owning event loop)."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._drive())

    async def stop(self) -> None:
        """Stop the driver; unfinished requests are aborted (safe to call twice)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for ls in list(self._live.values()):
            ls.done.set()
            ls.first.set()

    async def _drive(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            self.advance()
            nxt = self.env.peek()
            timeout = None if nxt is None else max(0.0, (nxt - self.vnow()) * self.time_scale)
            wake.clear()
            if timeout == 0.0:
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)

    def advance(self) -> None:
        """Run every replica event due by now; the clock then reads now."""
        v = self.vnow()
        self.env.run(until=v)
        self.env.now = max(self.env.now, v)

    # ---------------------------------------------------------------- requests
    @property
    def waiting(self) -> int:
        return len(self.replica.waiting)

    def submit(self, req: Request) -> LiveSeq:
        """The request reaches the engine now. ``req.request_id`` must be unique while live."""
        self.advance()
        ls = LiveSeq()
        self._live[req.request_id] = ls
        ls.seq = self.replica.submit(req)  # may finish at once (can never fit the pool)
        if self._wake is not None:
            self._wake.set()
        return ls

    def abort(self, ls: LiveSeq) -> None:
        """The client went away: drop the request (now if waiting, at the end of the step)."""
        if ls.seq.state == DONE:
            return
        self.advance()
        self.replica.abort(ls.seq)
        if self._wake is not None:
            self._wake.set()

    def tokens_now(self, ls: LiveSeq) -> int:
        """Output tokens generated by now (counting steps inside a decode run)."""
        s = ls.seq
        g = s.generated
        r = self.replica
        if s.state == RUNNING and r._run_k and s.computed >= s.target and s in r._decode:
            j = min(r._run_k, int((self.env.now - r._step_start) / r._run_dt + 1e-9))
            g += j
        return min(g, s.req.output_tokens)

    def snapshot(self) -> Snapshot:
        self.advance()
        return self.replica.snapshot()

    # ---------------------------------------------------------------- callbacks (model)
    def _count_prefix(self, s: Seq) -> None:
        if s.cached_first is not None:
            self.prefix_queries += s.req.input_tokens
            self.prefix_hits += s.cached_first
            self.prompt_tokens += s.req.input_tokens

    def _on_first_token(self, s: Seq) -> None:
        self._count_prefix(s)
        ls = self._live.get(s.req.request_id)
        if ls is not None:
            ls.first.set()
            ls.changed.set()

    def _on_finish(self, s: Seq) -> None:
        if not s.first_done:
            self._count_prefix(s)
        self.generation_tokens += s.generated
        reason = s.finish_reason or "abort"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        ls = self._live.pop(s.req.request_id, None)
        if ls is not None:
            ls.first.set()
            ls.done.set()
            ls.changed.set()
