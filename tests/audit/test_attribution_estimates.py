"""What a prefill would have taken on another replica: the prompt alone there (the idle fit at
the replica's speed), plus whatever stretched this prompt's measured prefill beyond the prompt
alone on the replica that ran it. Hand-built marts as in test_attribution: a prefill that runs
alone takes 1 ms per uncached token; two prefills sharing steps take 2 ms per token each."""

from __future__ import annotations

import duckdb
import pytest
from test_attribution import Fleet, primary, rows, seen


def prefill_est(con: duckdb.DuckDBPyConnection, request_id: str, replica: str) -> float:
    """The estimated prefill of ``request_id`` on ``replica``, in ms."""
    (row,) = rows(con, "select prefill_est_ms from int_attr_candidates_estimated "
                       "where request_key = ? and replica = ?", [f"k-{request_id}", replica])
    return float(row["prefill_est_ms"])


def calibrated_fleet() -> Fleet:
    """A and B each ran six prompts alone (decided on an idle replica, no prefill beside them:
    the idle fit, 1 ms/token) and six in pairs that shared every step (2 ms/token each): a fit
    over all their prefills puts a 1000-token prefill near 1500 ms."""
    f = Fleet()
    for k in range(6):
        tokens = 400 + 200 * k
        for replica in ("A", "B"):
            rid = f"solo{replica}{k}"
            t = -200_000.0 + 20_000.0 * k + (0.0 if replica == "A" else 5_000.0)
            f.decision(rid, at_ms=t, chosen=replica, policy="round_robin",
                       reason="round_robin",
                       candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
            f.served(rid, replica, arrive=t, queue=0.0, input_tokens=tokens)
            for j in range(2):
                f.served_took(f"pair{replica}{k}{j}", replica, arrive=t + 10_000.0, queue=0.0,
                              input_tokens=tokens, prefill_ms=2.0 * tokens, ttft_ms=2.0 * tokens)
    return f


def test_an_alternatives_prefill_is_the_prompt_alone_there() -> None:
    """S waited 1400 ms on A behind a 1500-token prompt, then prefilled its 1000 tokens in
    1000 ms, as alone; B was idle: 1000 ms there, a saving of 1400 ms. (The fit over every
    prefill, shared steps included, put B's prefill near 1500 ms.)"""
    f = calibrated_fleet()
    f.backlog("A", 1, tokens=1500)
    # B served the same lengths earlier: both replicas prefill at the same speed
    f.served("b1", "B", arrive=-30_000.0, queue=0.0, input_tokens=1500)
    f.served("b2", "B", arrive=-25_000.0, queue=0.0, input_tokens=1000)
    f.decision("S", at_ms=100.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(1, 0)}, {"replica": "B", **seen(0, 0)}])
    f.served("S", "A", arrive=100.0, queue=1400.0, input_tokens=1000)
    con = f.store()
    assert prefill_est(con, "S", "B") == pytest.approx(1000.0, abs=1.0)
    p = primary(con, "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "load_blind")
    assert p["excess_ms"] == pytest.approx(1400.0, abs=1.0)


def test_a_prefill_stretched_after_the_decision_would_have_been_stretched_elsewhere() -> None:
    """A and B were both idle when S (1000 tokens) went to A; a request that came 200 ms later
    shared S's prefill steps there, which took 2600 ms instead of 1000. Nothing at the decision
    made A worse than B: the same prompt is estimated 1000 + 1600 ms on B, no misrouting."""
    f = calibrated_fleet()
    # B went through the same earlier: both replicas prefill at the same speed
    for rid, tokens, ms in (("b1", 1000, 2600.0), ("b2", 1200, 2400.0)):
        e = f.served(rid, "B", arrive=-30_000.0, queue=0.0, input_tokens=tokens)
        e.update(prefill_ms=ms, ttft_ms=ms)
    f.decision("S", at_ms=1000.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
    f.served_took("S", "A", arrive=1000.0, queue=0.0, input_tokens=1000,
                  prefill_ms=2600.0, ttft_ms=2600.0)
    late = f.served("late", "A", arrive=1200.0, queue=0.0, input_tokens=1200)
    late.update(prefill_ms=2400.0, ttft_ms=2400.0)
    con = f.store()
    (b,) = rows(con, "select prefill_est_ms, ttft_est_ms from int_attr_candidates_estimated "
                     "where request_key = 'k-S' and replica = 'B'")
    assert b["prefill_est_ms"] == pytest.approx(2600.0, abs=1.0)
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "misrouting" not in causes


def _stretched_on_a(*, preemptions: int = 0, a_kv_usage: float = 0.3,
                    a_scraped_kv: float | None = None):
    """A and B both idle when S (1000 tokens) went to A, whose prefill of S took 2600 ms
    instead of 1000 alone; nothing else ran there. ``a_scraped_kv``: A's KV usage in a scrape
    100 ms before the decision."""
    f = calibrated_fleet()
    if a_scraped_kv is not None:
        f.snapshot("A", at_ms=900.0, waiting=0, running=0, kv=a_scraped_kv)
    for rid, tokens, ms in (("b1", 1000, 1000.0), ("b2", 1200, 1200.0)):
        e = f.served(rid, "B", arrive=-30_000.0, queue=0.0, input_tokens=tokens)
        e.update(prefill_ms=ms, ttft_ms=ms)
    f.decision("S", at_ms=1000.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 0, kv_usage=a_kv_usage)},
                           {"replica": "B", **seen(0, 0, kv_usage=0.3)}])
    e = f.served_took("S", "A", arrive=1000.0, queue=0.0, input_tokens=1000,
                      prefill_ms=2600.0, ttft_ms=2600.0)
    e.update(preemptions=preemptions)
    return f.store()


@pytest.mark.parametrize(("preemptions", "a_kv_usage", "a_scraped_kv"),
                         [(1, 0.3, None), (0, 0.95, None), (0, 0.3, 0.92)],
                         ids=["preempted", "kv_near_full_seen", "kv_near_full_scraped"])
def test_a_prefill_stretched_by_the_replicas_memory_is_not_carried_elsewhere(
        preemptions: int, a_kv_usage: float, a_scraped_kv: float | None) -> None:
    """The same stretch as above, but S was preempted on A, or A's KV cache was near full when
    the router looked or in A's scrape before the prefill (at least kv_pressure): the 1600 ms
    went on losing, recomputing or waiting for blocks there, A's memory, not the prompt. B
    gets the prompt alone (1000 ms), a saving of 1600 ms; without any sign the stretch is
    carried to B (no misrouting)."""
    con = _stretched_on_a(preemptions=preemptions, a_kv_usage=a_kv_usage,
                          a_scraped_kv=a_scraped_kv)
    assert prefill_est(con, "S", "B") == pytest.approx(1000.0, abs=1.0)
    assert prefill_est(con, "S", "A") == pytest.approx(2600.0, abs=1.0)
    p = primary(con, "S")
    assert p["cause"] == "misrouting"
    assert p["excess_ms"] == pytest.approx(1600.0, abs=1.0)
    plain = _stretched_on_a()
    assert prefill_est(plain, "S", "B") > 2000.0
    assert "misrouting" not in {
        r["cause"] for r in rows(plain, "select cause from attributions where request_id='S'")}


def test_a_prefill_sharing_steps_with_the_work_present_is_that_works_wait() -> None:
    """P (1500 tokens) was prefilling on A when S (1000 tokens) went there; A admitted S at
    once (queue 0) and their prefills shared steps: S's took 2500 ms instead of 1000. That is
    the wait P put on S (its first token 1450 ms after the decision), not something S would
    have met on the idle B: 1000 + 50 ms there, a saving of 1450 ms."""
    f = calibrated_fleet()
    # B went through the same earlier: both replicas prefill at the same speed
    for rid, tokens, ms in (("b1", 1500, 1500.0), ("b2", 1000, 2500.0)):
        e = f.served(rid, "B", arrive=-30_000.0, queue=0.0, input_tokens=tokens)
        e.update(prefill_ms=ms, ttft_ms=ms)
    f.served("P", "A", arrive=950.0, queue=0.0, input_tokens=1500)
    f.decision("S", at_ms=1000.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 1)}, {"replica": "B", **seen(0, 0)}])
    f.served_took("S", "A", arrive=1000.0, queue=0.0, input_tokens=1000,
                  prefill_ms=2500.0, ttft_ms=2500.0)
    con = f.store()
    assert prefill_est(con, "S", "B") == pytest.approx(1050.0, abs=1.0)
    p = primary(con, "S")
    assert p["cause"] == "misrouting"
    assert p["excess_ms"] == pytest.approx(1450.0, abs=1.0)


def test_an_evictions_saving_is_the_prefill_of_the_missing_tokens_alone() -> None:
    """The router predicted 1500 of E's 2500 tokens cached on A (p0 had served that prefix
    there); A held none at E's prefill, which ran alone: 2500 ms. Had the cache held them, the
    prefill would have been 1500 ms shorter, the missing tokens at the prompt-alone speed (the
    idle fit, 1 ms/token). The fit over every prefill (shared steps included, near 1.4 ms/token)
    put them near 2100 ms, more than E's prefill held beside the 1000 ms it needed anyway."""
    f = calibrated_fleet()
    f.served("p0", "A", arrive=-10_000.0, queue=0.0, input_tokens=900)
    f.decision("p0", at_ms=-10_000.0, chosen="A")
    f.prefixes.append(("p0", ["h1", "h2", "h3"]))
    f.prefixes.append(("E", ["h1", "h2", "h3", "h4", "h5"]))
    f.decision("E", at_ms=0.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[
                   {"replica": "A", "predicted_cached_tokens": 1500, **seen(0, 0)},
                   {"replica": "B", "predicted_cached_tokens": 0, **seen(0, 0)},
               ])
    f.served("E", "A", arrive=5.0, queue=0.0, input_tokens=2500, cached=0)
    f.rows["requests"][-1]["predicted_cached_tokens"] = 1500
    con = f.store()
    (fleet,) = rows(con, "select fleet_prefill_ms_per_token from int_attr_requests_placed "
                         "where request_key = 'k-E'")
    assert fleet["fleet_prefill_ms_per_token"] > 1.3  # the slope over every prefill
    p = primary(con, "E")
    assert (p["cause"], p["sub_kind"]) == ("eviction", "evicted_after_decision")
    # (the idle fit learns its points at the median replica's speed: within 1 %)
    assert p["excess_ms"] == pytest.approx(1500.0, rel=0.01)
    assert "1500 extra tokens, " in p["evidence"]
    assert " ms to prefill alone after the 0 held" in p["evidence"]
