"""Stale telemetry is the view differing where the policy looked: a rule that compares request
counts (cache_aware's load branch, least_request, a declared score replayed as counts) and gives
the replica the router chose on the counts it saw, but another one on the true counts, was
flipped by the view, however small the difference. Hand-built marts as in test_attribution
(every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

import pytest
from test_attribution import Fleet, at, primary, rows, seen


def off_by_one_fleet(policy: str, scores: dict[str, float] | None = None) -> Fleet:
    """B had a 3000-token prompt prefilling since t=0 (one request, seen right); A had one
    request decoding (its first token long past), seen as two (one waiting that had already
    left). On the counts it saw (A 2, B 1) the router sent S (1000 tokens, no predicted cache)
    to B at t=100; on the true counts (1 and 1) the tie goes to A, named first. S waited for
    B's prompt: TTFT 3900 ms against 1000 ms on A. ``scores``: what the router recorded as
    each candidate's score."""
    f = Fleet()
    a0 = f.served("a0", "A", arrive=-1000.0, queue=0.0, input_tokens=500)
    a0.update(decode_ms=10_000.0, end_at=at(-1000.0 + 500.0 + 10_000.0))
    f.served("b0", "B", arrive=0.0, queue=0.0, input_tokens=3000)
    f.decision("S", at_ms=100.0, chosen="B", policy=policy, reason="least_load_low_match",
               candidates=[
                   {"replica": r, "predicted_cached_tokens": 0, **view,
                    **({"score": scores[r]} if scores else {})}
                   for r, view in (("A", seen(1, 1)), ("B", seen(0, 1)))
               ])
    f.served("S", "B", arrive=100.0, queue=2900.0, input_tokens=1000)
    return f


@pytest.mark.parametrize(("policy", "scores"), [
    ("cache_aware", None),
    ("least_requests", None),
    ("fewest_in_flight", {"A": 2.0, "B": 1.0}),
])
def test_a_count_off_by_one_that_flips_the_choice_is_stale_telemetry(
        policy: str, scores: dict[str, float] | None) -> None:
    """Only A's count was wrong, and by one (below stale_min_gap): on the true counts the
    policy would have chosen A, which met the SLO. The view flipped the choice: stale
    telemetry, sized by what A saves, not misrouting. (A policy the audit does not know,
    ``fewest_in_flight``, recorded the requests it saw as its score: replayed as those
    counts.)"""
    con = off_by_one_fleet(policy, scores).store()
    (placed,) = rows(con, "select policy_true_replica, policy_view_compares_counts, "
                          "policy_true_seen_load, policy_true_true_load, "
                          "c_seen_waiting + c_seen_running as c_seen_load, "
                          "c_true_waiting + c_true_running as c_true_load "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed == {"policy_true_replica": "A", "policy_view_compares_counts": True,
                      "policy_true_seen_load": 2.0, "policy_true_true_load": 1,
                      "c_seen_load": 1.0, "c_true_load": 1}
    p = primary(con, "S")
    assert p["cause"] == "stale_telemetry"
    assert p["evidence"].startswith(f"on the true state its policy ({policy}")
    assert " would have chosen A: " in p["evidence"]
    assert p["excess_ms"] == pytest.approx(2900.0, abs=1.0)


def test_counts_seen_right_leave_the_choice_to_the_policy() -> None:
    """The router saw A's count right (1): on its view A and B tie and cache_aware takes A,
    named first, but it chose B. The replay does not give the replica chosen, so the audit does
    not claim what the policy would have done: no stale telemetry."""
    f = off_by_one_fleet("cache_aware")
    for c in f.rows["candidates"]:
        if c["replica"] == "A":
            c["waiting"] = 0
    con = f.store()
    (placed,) = rows(con, "select policy_true_replica, policy_view_compares_counts "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed == {"policy_true_replica": None, "policy_view_compares_counts": None}
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "stale_telemetry" not in causes


def test_counts_rebuilt_from_scrapes_are_not_the_routers_view() -> None:
    """The same decision recorded without its candidates: the audit rebuilds them from the
    replicas' scrapes (A 2, B 1), what the router could at best have seen, not what it saw.
    A count off by one there is no proof the router's view was wrong: the materiality test
    applies, and the replay's choice of A is misrouting, not stale telemetry."""
    f = off_by_one_fleet("cache_aware")
    f.rows["candidates"].clear()
    f.rows["decisions"][-1].update(recorded=False, candidate_count=0)
    f.snapshot("A", at_ms=50.0, waiting=1, running=1)
    f.snapshot("B", at_ms=50.0, waiting=0, running=1)
    con = f.store()
    (placed,) = rows(con, "select evidence_source, policy_true_replica, "
                          "policy_view_compares_counts "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed == {"evidence_source": "reconstructed", "policy_true_replica": "A",
                      "policy_view_compares_counts": False}
    p = primary(con, "S")
    assert p["cause"] == "misrouting"
