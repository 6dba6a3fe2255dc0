"""The reference router: telemetry snapshots with their age, pending assignments, a prefix view.

A router never touches a replica; it is handed snapshots by the telemetry poller and returns
decisions. It owns its policy instance, its rng, its pending list and its prefix tree, so several
independent routers (herding) are just several instances.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence

from ._config import CostModel, RouterConfig
from ._prefix_tree import LastReplicaIndex, PrefixTree
from ._replica import Snapshot
from ._requests import Request
from .policies import CandidateView, CandidateViewBuilder, Choice, RequestView, make_policy

__all__ = ["Router", "build_views"]


def build_views(
    req: Request,
    snaps: Sequence[Snapshot],
    now: float,
    *,
    pending: Sequence[int],
    pending_tokens: Sequence[int],
    pending_prefill: Sequence[int],
    predicted: Sequence[int],
    cost: CostModel,
    max_batched_tokens: int,
    admission_limit: int | None,
) -> list[CandidateView]:
    """Candidate rows for a policy from snapshots plus pending work and cache predictions."""
    out: list[CandidateView] = []
    inp = req.input_tokens
    # CostModel.estimate_ms (speed 1) inlined with the same float operations in the same
    # order, so results stay bit-identical: this loop runs three times per simulated request.
    overhead = cost.step_overhead_ms
    per_seq = cost.decode_ms_per_seq
    pmt = cost.prefill_ms_per_token
    attn = cost.prefill_attn_ms_per_token2
    ceil = math.ceil
    view = CandidateView
    builder = CandidateViewBuilder
    im1 = inp - 1
    no_limit = admission_limit is None
    append = out.append
    for i, s in enumerate(snaps):
        pc = predicted[i]
        if inp > 0:
            cached = pc if pc < im1 else im1
            uncached = inp - cached
        else:
            uncached = 0
            cached = min(pc, 0)
        rp = s.remaining_prefill_tokens
        running = s.running
        waiting = s.waiting
        per_step = overhead + per_seq * running
        # max(0.0, x) as a branch: the same value (and float-ness only where it cannot matter)
        backlog: float = rp + pending_prefill[i]
        if backlog <= 0:
            backlog = 0.0
        q = backlog * pmt + ceil(backlog / max_batched_tokens) * per_step
        steps = ceil(uncached / max_batched_tokens)
        p = uncached * (pmt + attn * (cached + uncached / 2)) + (steps if steps > 1 else 1) * per_step
        pend = pending[i]
        ts = s.ts
        v = builder(
            i, s.replica, no_limit or waiting + pend < admission_limit,  # type: ignore[operator]
            waiting, running, s.kv_usage, rp, rp + s.remaining_decode_tokens, ts,
            now - ts, pend, pending_tokens[i], pc, q, p,
        )
        v.__class__ = view  # a CandidateView (frozen) from here on
        append(v)
    return out


class _Pending(deque[tuple[float, int, int]]):
    """A router's pending assignments to one replica, ``(time the replica has it, prefill
    tokens, total tokens)``, oldest first, with the sums of their prefill and total tokens kept
    as entries come and go (integers: the same sums as recomputed from the entries)."""

    def __init__(self) -> None:
        super().__init__()
        self.prefill = 0
        self.total = 0

    def append(self, x: tuple[float, int, int]) -> None:
        super().append(x)
        self.prefill += x[1]
        self.total += x[2]

    def popleft(self) -> tuple[float, int, int]:
        x = super().popleft()
        self.prefill -= x[1]
        self.total -= x[2]
        return x

    def pop(self) -> tuple[float, int, int]:  # type: ignore[override]  # deque.pop() takes no index
        x = super().pop()
        self.prefill -= x[1]
        self.total -= x[2]
        return x


class Router:
    """One router instance."""

    def __init__(
        self,
        index: int,
        router_id: str,
        cfg: RouterConfig,
        cost: CostModel,
        n_replicas: int,
        max_batched_tokens: int,
        expected_output_tokens: int,
        rng: random.Random,
    ) -> None:
        self.index = index
        self.id = router_id
        self.cfg = cfg
        self.cost = cost
        self.n = n_replicas
        self.mbt = max_batched_tokens
        self.exp_out = expected_output_tokens
        self.rng = rng
        self.policy = make_policy(cfg.policy, cfg, cost, max_batched_tokens)
        self.tree: PrefixTree | LastReplicaIndex | None = None
        if self.policy.uses_prefix:
            kind = LastReplicaIndex if cfg.prefix_index == "last_replica" else PrefixTree
            self.tree = kind(n_replicas, cfg.tree_max_tokens)
        self.snapshots: list[Snapshot] = []
        # per replica: (time the replica has it, prefill tokens, total tokens), oldest first
        self.pending: list[_Pending] = [_Pending() for _ in range(n_replicas)]
        self._last_evict = 0.0

    def on_telemetry(self, snaps: list[Snapshot], now: float) -> None:
        """New snapshots: forget pending assignments they already reflect."""
        self.snapshots = snaps
        for i, s in enumerate(snaps):
            dq = self.pending[i]
            ts = s.ts
            while dq and dq[0][0] < ts:  # a poll at the arrival instant runs first
                dq.popleft()
        if self.tree is not None and now - self._last_evict >= self.cfg.tree_eviction_interval_s:
            self.tree.evict()
            self._last_evict = now

    def on_unread_telemetry(self, now: float) -> None:
        """A poll whose snapshots no decision will read (the next poll comes first): only the
        prefix tree's eviction runs as :meth:`on_telemetry` would run it."""
        if self.tree is not None and now - self._last_evict >= self.cfg.tree_eviction_interval_s:
            self.tree.evict()
            self._last_evict = now

    def predicted(self, req: Request) -> list[int]:
        if self.tree is None:
            return [0] * self.n
        return self.tree.match_all(req)

    def pending_sums(self) -> tuple[list[int], list[int], list[int]]:
        if not self.cfg.pending_correction:
            z = [0] * self.n
            return z, z, z
        pending = self.pending
        return ([len(d) for d in pending], [d.total for d in pending],
                [d.prefill for d in pending])

    def views(self, req: Request, now: float, predicted: list[int]) -> list[CandidateView]:
        cnt, tot, pre = self.pending_sums()
        return build_views(
            req, self.snapshots, now, pending=cnt, pending_tokens=tot, pending_prefill=pre,
            predicted=predicted, cost=self.cost, max_batched_tokens=self.mbt,
            admission_limit=self.cfg.admission_limit,
        )

    @staticmethod
    def request_view(req: Request) -> RequestView:
        return RequestView(req.request_id, req.input_tokens, req.max_tokens)

    def commit(self, req: Request, choice: Choice, predicted: list[int], reach_time: float) -> None:
        """Record the decision actually taken: policy state, pending work, prefix tree."""
        self.policy.commit(choice)
        i = choice.index
        if i is None:
            return
        pre = req.input_tokens - min(predicted[i], req.input_tokens)
        self.pending[i].append((reach_time, pre, pre + min(req.max_tokens, self.exp_out)))
        if self.tree is not None:
            self.tree.insert(i, req)
