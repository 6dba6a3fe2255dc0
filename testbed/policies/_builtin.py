"""Reference policies. Scores: lower is better unless the docstring says otherwise."""

from __future__ import annotations

import random
from collections.abc import Sequence

from .._config import CostModel, RouterConfig
from ._base import CandidateView, Choice, RequestView, register_policy

__all__ = ["CacheAware", "LeastLoad", "PowerOfTwo", "QPCost", "RandomPolicy", "RoundRobin"]

_NONE = Choice(None, "no_eligible_replica")


def _eligible(cands: Sequence[CandidateView]) -> list[CandidateView]:
    return [c for c in cands if c.eligible]


class RoundRobin:
    """Next eligible replica after the last one chosen; blind to load and cache."""

    name = "round_robin"
    uses_prefix = False

    def __init__(self) -> None:
        self._next = 0

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice:
        n = len(cands)
        for off in range(n):
            c = cands[(self._next + off) % n]
            if c.eligible:
                return Choice(c.index, "round_robin")
        return _NONE

    def commit(self, choice: Choice) -> None:
        if choice.index is not None:
            self._next = choice.index + 1


class RandomPolicy:
    """Uniform over eligible replicas (one draw from the router's rng)."""

    name = "random"
    uses_prefix = False

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice:
        el = _eligible(cands)
        if not el:
            return _NONE
        return Choice(el[rng.randrange(len(el))].index, "random")

    def commit(self, choice: Choice) -> None:
        pass


class PowerOfTwo:
    """Sample two distinct eligible replicas, keep the one with less remaining work (tokens)."""

    name = "power_of_two"
    uses_prefix = False

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice:
        el = _eligible(cands)
        if not el:
            return _NONE
        if len(el) == 1:
            return Choice(el[0].index, "only_eligible")
        a, b = rng.sample(el, 2)
        best = a if (a.work_tokens, a.index) <= (b.work_tokens, b.index) else b
        scores: list[float | None] = [None] * len(cands)
        for c in (a, b):
            scores[c.index] = float(c.work_tokens)
        return Choice(best.index, "power_of_two", tuple(scores))

    def commit(self, choice: Choice) -> None:
        pass


class LeastLoad:
    """Least remaining work in tokens (prefill to do + expected decode + pending), not requests."""

    name = "least_load"
    uses_prefix = False

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice:
        el = _eligible(cands)
        if not el:
            return _NONE
        best = min(el, key=lambda c: (c.work_tokens, c.index))
        return Choice(best.index, "least_load", tuple(float(c.work_tokens) for c in cands))

    def commit(self, choice: Choice) -> None:
        pass


class CacheAware:
    """SGLang / SMG ``cache_aware``.

    Load is the request count (waiting + running + pending). If the fleet is imbalanced
    (``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``) route to
    the least loaded. Otherwise take the replica with the longest predicted prefix match if its
    match rate (matched / input tokens) exceeds ``cache_threshold`` (SGLang compares with ``>``),
    else the least loaded. Scores are match rates (higher is better).
    """

    name = "cache_aware"
    uses_prefix = True

    def __init__(self, cfg: RouterConfig) -> None:
        self.abs_t = cfg.balance_abs_threshold
        self.rel_t = cfg.balance_rel_threshold
        self.cache_t = cfg.cache_threshold

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice:
        el = _eligible(cands)
        if not el:
            return _NONE
        rates = tuple(c.predicted_cached_tokens / max(1, req.input_tokens) for c in cands)
        loads = [c.load for c in el]
        mx, mn = max(loads), min(loads)
        least = min(el, key=lambda c: (c.load, c.index))
        if mx - mn > self.abs_t and mx > mn * self.rel_t:
            return Choice(least.index, "least_load_imbalanced", rates)
        best = min(el, key=lambda c: (-c.predicted_cached_tokens, c.load, c.index))
        if rates[best.index] > self.cache_t:
            return Choice(best.index, "cache_affinity", rates)
        return Choice(least.index, "least_load_low_match", rates)

    def commit(self, choice: Choice) -> None:
        pass


class QPCost:
    """The seed's Q+P: minimise estimated wait plus estimated prefill of the uncached part."""

    name = "qp_cost"
    uses_prefix = True

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice:
        scores = tuple([c.est_queue_ms + c.est_prefill_ms for c in cands])
        best = None
        best_key = None
        for c in cands:  # min over the eligible of (score, index): the first smallest score
            if c.eligible:
                sc = scores[c.index]
                if best is None or (sc, c.index) < best_key:  # type: ignore[operator]
                    best = c
                    best_key = (sc, c.index)
        if best is None:
            return _NONE
        return Choice(best.index, "min_queue_plus_prefill", scores)

    def commit(self, choice: Choice) -> None:
        pass


@register_policy("round_robin")
def _rr(cfg: RouterConfig, cost: CostModel, mbt: int) -> RoundRobin:
    return RoundRobin()


@register_policy("random")
def _random(cfg: RouterConfig, cost: CostModel, mbt: int) -> RandomPolicy:
    return RandomPolicy()


@register_policy("power_of_two")
def _p2(cfg: RouterConfig, cost: CostModel, mbt: int) -> PowerOfTwo:
    return PowerOfTwo()


@register_policy("least_load")
def _ll(cfg: RouterConfig, cost: CostModel, mbt: int) -> LeastLoad:
    return LeastLoad()


@register_policy("cache_aware")
def _ca(cfg: RouterConfig, cost: CostModel, mbt: int) -> CacheAware:
    return CacheAware(cfg)


@register_policy("qp_cost")
def _qp(cfg: RouterConfig, cost: CostModel, mbt: int) -> QPCost:
    return QPCost()
