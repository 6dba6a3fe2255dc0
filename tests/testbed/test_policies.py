from __future__ import annotations

import random

import pytest

from testbed import RouterConfig, UnknownNameError
from testbed.policies import POLICIES, CandidateView, RequestView, make_policy

REQ = RequestView("r", 1000, 256)


def cv(i: int, *, waiting: int = 0, running: int = 0, rem: int = 0, pending: int = 0,
       pending_tokens: int = 0, cached: int = 0, q: float = 0.0, p: float = 0.0,
       eligible: bool = True) -> CandidateView:
    return CandidateView(i, f"replica-{i}", eligible, waiting, running, 0.1, rem, rem, 0.0, 0.0,
                         pending, pending_tokens, cached, q, p)


def test_registry_has_all_reference_policies() -> None:
    assert set(POLICIES) >= {"round_robin", "random", "power_of_two", "least_load", "cache_aware", "qp_cost"}
    with pytest.raises(UnknownNameError):
        make_policy("nope")


def test_round_robin_cycles_and_skips_ineligible() -> None:
    p = make_policy("round_robin")
    cands = [cv(0), cv(1, eligible=False), cv(2)]
    got = []
    for _ in range(4):
        ch = p.decide(REQ, cands, random.Random(0))
        p.commit(ch)
        got.append(ch.index)
    assert got == [0, 2, 0, 2]


def test_decide_does_not_change_state() -> None:
    p = make_policy("round_robin")
    cands = [cv(0), cv(1)]
    assert p.decide(REQ, cands, random.Random(0)).index == p.decide(REQ, cands, random.Random(0)).index


def test_least_load_counts_tokens_not_requests() -> None:
    # the seed's example: 4 short waiting vs 4 long waiting
    p = make_policy("least_load")
    a = cv(0, waiting=4, rem=4 * 8192)
    b = cv(1, waiting=4, rem=4 * 128)
    assert p.decide(REQ, [a, b], random.Random(0)).index == 1
    # pending tokens count too
    assert p.decide(REQ, [cv(0, rem=100, pending_tokens=1000), cv(1, rem=500)], random.Random(0)).index == 1


def test_power_of_two_picks_lighter_of_sample() -> None:
    p = make_policy("power_of_two")
    cands = [cv(0, rem=900), cv(1, rem=100)]
    for s in range(5):
        assert p.decide(REQ, cands, random.Random(s)).index == 1


def test_random_only_eligible() -> None:
    p = make_policy("random")
    cands = [cv(0, eligible=False), cv(1), cv(2, eligible=False)]
    assert {p.decide(REQ, cands, random.Random(s)).index for s in range(10)} == {1}
    assert make_policy("random").decide(REQ, [cv(0, eligible=False)], random.Random(0)).index is None


def test_cache_aware_balanced_high_match_picks_best_match() -> None:
    p = make_policy("cache_aware", RouterConfig(policy="cache_aware"))
    cands = [cv(0, running=10, cached=0), cv(1, running=20, cached=600), cv(2, running=5, cached=100)]
    ch = p.decide(REQ, cands, random.Random(0))
    assert (ch.index, ch.reason) == (1, "cache_affinity")


def test_cache_aware_balanced_low_match_picks_least_load() -> None:
    p = make_policy("cache_aware", RouterConfig(policy="cache_aware"))
    cands = [cv(0, running=10, cached=200), cv(1, running=20, cached=250), cv(2, running=5, cached=100)]
    ch = p.decide(REQ, cands, random.Random(0))
    assert (ch.index, ch.reason) == (2, "least_load_low_match")


def test_cache_aware_imbalanced_picks_least_load_despite_match() -> None:
    p = make_policy("cache_aware", RouterConfig(policy="cache_aware"))
    # max-min = 90 > 64 and 100 > 10 * 1.5: imbalanced
    cands = [cv(0, running=100, cached=1000), cv(1, running=10, cached=0), cv(2, running=50)]
    ch = p.decide(REQ, cands, random.Random(0))
    assert (ch.index, ch.reason) == (1, "least_load_imbalanced")
    # abs gap large but relative gap small (200 vs 140): still balanced -> cache
    cands = [cv(0, running=200, cached=1000), cv(1, running=140)]
    assert p.decide(REQ, cands, random.Random(0)).reason == "cache_affinity"


def test_cache_aware_load_includes_pending() -> None:
    p = make_policy("cache_aware", RouterConfig(policy="cache_aware"))
    cands = [cv(0, running=0, pending=100, cached=1000), cv(1, running=10)]
    assert p.decide(REQ, cands, random.Random(0)).index == 1


def test_qp_cost_trades_wait_against_prefill() -> None:
    # the seed's example: A saves 80 ms of prefill but waits 160 ms longer -> B
    p = make_policy("qp_cost")
    a = cv(0, q=180.0, p=20.0, cached=900)
    b = cv(1, q=20.0, p=100.0)
    assert p.decide(REQ, [a, b], random.Random(0)).index == 1
    a2 = cv(0, q=20.0, p=20.0, cached=900)  # A's wait drops to 20 ms: decision flips
    assert p.decide(REQ, [a2, b], random.Random(0)).index == 0
