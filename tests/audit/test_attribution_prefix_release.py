"""How long an alternative keeps a prefix it served: an LRU prefix cache evicts the entries
released longest ago first, so a block is held while what was released there after it, the
work running there at the decision and the prompt's prefix itself fit in the replica's KV pool;
the pool is the median of the estimates the decision's candidates give (tokens running over the
KV usage the router saw). Hand-built marts as in test_attribution (every replica prefills at
1 ms per uncached token)."""

from __future__ import annotations

import pytest
from test_attribution import Fleet, rows, seen


def released_fleet(*, p0_decode: float = 500.0, b_later: tuple[tuple[str, float, int, int], ...]
                   = (), b_running: int = 0, b_usage: float | None = None,
                   others: tuple[tuple[int, float], ...] = ((10_000, 0.25),)) -> Fleet:
    """S (2000 tokens, 4 prefix blocks) goes to the idle A at t=0. B served p0 60 s before
    (sharing S's first two blocks: 1000 of S's tokens), which decoded ``p0_decode`` ms after
    its first token, then ``b_later`` (request id, arrival, input tokens, cached tokens: each
    prefilled at once and ended 500 ms after its first token). ``b_running``: tokens of a
    prompt B was decoding at S's decision, ``b_usage`` the KV usage the router saw of B.
    ``others``: further candidates, each prefilling a prompt of that many tokens at S's
    decision, seen at that KV usage."""
    f = Fleet()
    p0 = f.execution("p0", "B", arrive=-60_000.0, queue=0.0, input_tokens=1000, decode=p0_decode)
    f.request("p0", start=-60_010.0, ttft=p0["ttft_ms"] + 20.0, input_tokens=1000,
              replica="B", replica_ttft=p0["ttft_ms"], actual=0)
    f.decision("p0", at_ms=-60_000.0, chosen="B", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
    f.prefixes.append(("p0", ["h1", "h2"]))
    for rid, arrive, tokens, cached in b_later:
        f.served(rid, "B", arrive=arrive, queue=0.0, input_tokens=tokens, cached=cached)
    if b_running:
        f.execution("r", "B", arrive=-30_000.0, queue=0.0, input_tokens=b_running,
                    decode=60_000.0)
        f.request("r", start=-30_010.0, ttft=b_running + 20.0, input_tokens=b_running,
                  replica="B", replica_ttft=float(b_running), actual=0)
    candidates = [
        {"replica": "A", "predicted_cached_tokens": 0, **seen(0, 0)},
        {"replica": "B", "predicted_cached_tokens": 0,
         **seen(0, 1 if b_running else 0, kv_usage=b_usage)},
    ]
    for i, (tokens, usage) in enumerate(others):
        replica = f"C{i}"
        f.served(f"c{i}", replica, arrive=-1_000.0, queue=0.0, input_tokens=tokens)
        candidates.append({"replica": replica, "predicted_cached_tokens": 0,
                           **seen(0, 1, kv_usage=usage)})
    f.prefixes.append(("S", ["h1", "h2", "h3", "h4"]))
    f.decision("S", at_ms=0.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=candidates)
    f.served("S", "A", arrive=5.0, queue=0.0, input_tokens=2000, cached=0)
    return f


def b_cached(f: Fleet) -> int:
    """The cache S is assumed to find on B (1000: the two blocks B served; 0: none held)."""
    (b,) = rows(f.store(), "select cached_assumed_tokens, cache_source from "
                           "int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b["cache_source"] == "prefix_history"
    return int(b["cached_assumed_tokens"])


TWO_PROMPTS = (("q1", -58_000.0, 20_000, 0), ("q2", -36_000.0, 20_000, 0))
"""Two 20,000-token prompts B served after p0's first token, ended 37.5 and 15.5 s before S."""


@pytest.mark.parametrize(("p0_decode", "cached"), [(54_000.0, 1000), (500.0, 0)])
def test_a_block_ages_from_its_release_not_its_prefill(p0_decode: float, cached: int) -> None:
    """The pool is 40,000 tokens (C0 runs 10,000 at a KV usage of 0.25). B allocated 40,000
    tokens of other prompts after p0's prefill, but while p0 still decoded (54 s), its blocks
    referenced: they were released after them, and an LRU cache evicts the older first, so B
    held S's prefix. Had p0 ended at once, those 40,000 tokens and the prefix (1000) would not
    fit in the pool."""
    assert b_cached(released_fleet(p0_decode=p0_decode, b_later=TWO_PROMPTS)) == cached


@pytest.mark.parametrize(("others_usage", "cached"), [(0.1, 1000), (0.5, 0)])
def test_the_pool_is_the_median_of_the_candidates_estimates(others_usage: float,
                                                            cached: int) -> None:
    """B runs 10,000 tokens at a KV usage the router saw as 0.5 (alone: a 20,000-token pool,
    no room for the 30,000 tokens released there since p0), C0 and C1 each 10,000 at
    ``others_usage``. At 0.1 the median pool is 100,000 tokens: the 30,000 released, B's
    10,000 running and the prefix fit, B held it; at 0.5 every estimate is 20,000 and it did
    not."""
    f = released_fleet(b_later=(("q1", -50_000.0, 30_000, 0),), b_running=10_000, b_usage=0.5,
                       others=((10_000, others_usage), (10_000, others_usage)))
    assert b_cached(f) == cached


@pytest.mark.parametrize(("released", "cached"), [(18_500, 1000), (19_250, 500), (20_000, 0)])
def test_the_prompts_own_prefix_must_fit_too(released: int, cached: int) -> None:
    """The pool is 20,000 tokens (C0 runs 10,000 at 0.5). With 18,500 tokens released on B
    since p0 both blocks of S's prefix (1000 tokens) still fit; with 19,250 only the first
    (500); with 20,000 not even that."""
    f = released_fleet(b_later=(("q1", -50_000.0, released, 0),), others=((10_000, 0.5),))
    assert b_cached(f) == cached


@pytest.mark.parametrize(("tokens", "cached"), [(15_000, 1000), (25_000, 0)])
def test_a_released_prompt_counts_whole_cached_or_not(tokens: int, cached: int) -> None:
    """The pool is 20,000 tokens. q1 found 10,000 of its prompt cached on B: those entries were
    released with it, newer than p0's, so all of q1's prompt is ahead of S's prefix in the LRU
    order, not only the 5,000 or 15,000 tokens it computed."""
    f = released_fleet(b_later=(("q1", -50_000.0, tokens, 10_000),), others=((10_000, 0.5),))
    assert b_cached(f) == cached


def test_no_candidate_seen_in_use_leaves_the_pool_unsized() -> None:
    """Every candidate was seen at a KV usage of 0: no pool to size, and a prefix served 60 s
    before is judged by the 30 s window of an unsized pool (not held), however little B
    released since."""
    f = released_fleet(others=((10_000, 0.0),))
    assert b_cached(f) == 0
