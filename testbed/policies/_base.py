from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, make_dataclass
from typing import Protocol

from .._config import CostModel, RouterConfig
from .._errors import UnknownNameError

__all__ = ["POLICIES", "CandidateView", "Choice", "Policy", "RequestView", "make_policy", "register_policy"]


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a router knows about a request: lengths and prefix keys, never its output length."""

    request_id: str
    input_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class CandidateView:
    """One replica as a router sees it at decision time.

    ``waiting``/``running``/``remaining_*``/``kv_usage`` come from the last snapshot
    (``age_s`` old); ``pending``/``pending_tokens`` are the router's own assignments not yet in
    that snapshot (0 without pending correction) and are already *added* to ``load`` and
    ``work_tokens``. ``predicted_cached_tokens`` is the router's prefix prediction (0 when the
    policy keeps none). ``est_queue_ms``/``est_prefill_ms`` are Q and P of the cost model.
    """

    index: int
    replica: str
    eligible: bool
    waiting: int
    running: int
    kv_usage: float
    remaining_prefill_tokens: int
    remaining_tokens: int
    telemetry_ts: float
    age_s: float
    pending: int
    pending_tokens: int
    predicted_cached_tokens: int
    est_queue_ms: float
    est_prefill_ms: float

    @property
    def load(self) -> int:
        """Request count incl. pending (SGLang's notion of load)."""
        return self.waiting + self.running + self.pending

    @property
    def work_tokens(self) -> int:
        """Remaining work in tokens incl. pending (prefill still to do + expected decode)."""
        return self.remaining_tokens + self.pending_tokens


# The same slots as CandidateView, without the frozen __setattr__: an instance built with it and
# given ``__class__ = CandidateView`` is a true (frozen) CandidateView, built about twice as fast
# (the router builds one per replica at every decision, three with ground truth).
CandidateViewBuilder = make_dataclass(
    "CandidateViewBuilder", [(f.name, f.type) for f in fields(CandidateView)], slots=True,
    eq=False, repr=False,
)


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy's answer: index into the candidates (None: nothing eligible), a reason, and a
    per-candidate score (None where the policy computed none)."""

    index: int | None
    reason: str
    scores: tuple[float | None, ...] = ()


class Policy(Protocol):
    name: str
    uses_prefix: bool

    def decide(self, req: RequestView, cands: Sequence[CandidateView], rng: random.Random) -> Choice: ...

    def commit(self, choice: Choice) -> None: ...


PolicyFactory = Callable[[RouterConfig, CostModel, int], Policy]
POLICIES: dict[str, PolicyFactory] = {}
"""Policy name -> factory ``(router_config, cost_model, max_batched_tokens) -> Policy``."""


def register_policy(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def deco(factory: PolicyFactory) -> PolicyFactory:
        POLICIES[name] = factory
        return factory

    return deco


def make_policy(
    name: str, cfg: RouterConfig | None = None, cost: CostModel | None = None, max_batched_tokens: int = 8192
) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownNameError(f"unknown policy {name!r}; known: {sorted(POLICIES)}") from None
    return factory(cfg or RouterConfig(policy=name), cost or CostModel(), max_batched_tokens)
