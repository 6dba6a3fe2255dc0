"""Cause rules that match their words: overload only when the request itself queued, evidence
with this decision's own figures, sub-kinds that fit the router's policy. Hand-built marts as
in test_attribution (every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

from test_attribution import Fleet, primary, rows, seen


def test_no_overload_when_the_request_itself_did_not_queue() -> None:
    """Both replicas are busy, but the replica started S at once (queue 0 ms): the load cost S
    nothing. Its 3000-token prompt is what missed the SLO."""
    f = Fleet()
    f.backlog("A", 10)
    f.backlog("B", 10)
    f.decision("S", at_ms=100.0, chosen="A", policy="least_load", reason="least_load",
               candidates=[{"replica": "A", **seen(9, 1)}, {"replica": "B", **seen(9, 1)}])
    f.served("S", "A", arrive=100.0, queue=0.0, input_tokens=3000)
    con = f.store()
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "overload" not in causes
    assert primary(con, "S")["cause"] == "long_prompt"


def test_overload_is_at_most_what_the_request_itself_waited() -> None:
    """Both replicas are busy: their work present has its first tokens 1900 ms after the
    decision, the shortest estimated wait. But A admitted S after 200 ms (its scheduler shared
    the steps): the load cost S 200 ms, not 1900 ms, below the significance bar. Its
    2500-token prompt is what missed the SLO."""
    f = Fleet()
    f.backlog("A", 2)
    f.backlog("B", 2)
    f.decision("S", at_ms=100.0, chosen="A", policy="least_load", reason="least_load",
               candidates=[{"replica": "A", **seen(1, 1)}, {"replica": "B", **seen(1, 1)}])
    f.served("S", "A", arrive=100.0, queue=200.0, input_tokens=2500)
    con = f.store()
    (placed,) = rows(con, "select min_wait_ms from int_attr_requests_placed "
                          "where request_key = 'k-S'")
    assert placed["min_wait_ms"] >= 1800.0
    overload = rows(con, "select excess_ms from attributions "
                         "where request_id = 'S' and cause = 'overload'")
    assert all(r["excess_ms"] <= 200.0 for r in overload)
    assert primary(con, "S")["cause"] == "long_prompt"


def test_herding_evidence_counts_this_decisions_unreflected_assignments() -> None:
    f = Fleet()
    f.served("a0", "A", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    sample_age = 300.0
    for k in range(5):
        rid = f"h{k}"
        f.decision(rid, at_ms=10.0 * k, chosen="A", router="r1" if k % 2 == 0 else "r2",
                   policy="least_load", reason="least_load", candidates=[
                       {"replica": "A", "waiting": 0, "running": 0, "pending": k // 2,
                        "telemetry_age_ms": sample_age + 10 * k},
                       {"replica": "B", "waiting": 3, "running": 0, "pending": 0,
                        "telemetry_age_ms": sample_age + 10 * k},
                   ])
        f.served(rid, "A", arrive=10.0 * k, queue=max(1500.0 * k - 10.0 * k, 0.0),
                 input_tokens=1500)
    con = f.store()
    p = primary(con, "h4")
    assert (p["cause"], p["sub_kind"]) == ("stale_telemetry", "herding")
    # h4 is the 5th decision and its router counted 2 pending: 2 of the 4 earlier assignments
    # were missing from its view (the episode's sum over its decisions is 6)
    assert "decision 5 of 5 on that telemetry sample; 2 earlier assignments unreflected" in p["evidence"]


def least_load_fleet(policy: str) -> Fleet:
    """The router counted requests right (A 2, B 3) and picked A; A's two are 5000-token
    prompts, B's three take 100 ms each. The view was not stale: counting requests misjudged
    the work."""
    f = Fleet()
    f.backlog("A", 2, tokens=5000)
    f.backlog("B", 3, tokens=100)
    f.decision("S", at_ms=100.0, chosen="A", policy=policy, reason=policy, candidates=[
        {"replica": "A", **seen(2, 0)}, {"replica": "B", **seen(3, 0)}])
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000)
    return f


def test_a_load_reading_policy_is_never_load_blind() -> None:
    p = primary(least_load_fleet("least_load").store(), "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "load_misjudged")
    # the same choice by a policy that does not read load is load-blind
    p = primary(least_load_fleet("round_robin").store(), "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "load_blind")


def test_cache_blind_only_when_the_alternative_held_the_prefix_the_chosen_lacked() -> None:
    """A and B both held 1000 of S's 3000 tokens; A prefills at 3 ms/token, B at 1: the
    difference was speed, not cache."""
    f = Fleet()
    for k in range(6):
        tokens = 400 + 200 * k
        e = f.served(f"a{k}", "A", arrive=-60_000.0 + 5000 * k, queue=0.0, input_tokens=tokens)
        e.update(prefill_ms=3.0 * tokens, ttft_ms=3.0 * tokens)
        f.served(f"b{k}", "B", arrive=-60_000.0 + 5000 * k, queue=0.0, input_tokens=tokens)
    f.decision("S", at_ms=100.0, chosen="A", candidates=[
        {"replica": "A", "predicted_cached_tokens": 1000, **seen(0, 0)},
        {"replica": "B", "predicted_cached_tokens": 1000, **seen(0, 0)}])
    e = f.served("S", "A", arrive=100.0, queue=0.0, input_tokens=3000, cached=1000)
    e.update(prefill_ms=6000.0, ttft_ms=6000.0)
    f.rows["requests"][-1].update(predicted_cached_tokens=1000, replica_ttft_ms=6000.0,
                                  ttft_ms=6020.0)
    con = f.store()
    (m,) = rows(con, "select * from attributions where request_id = 'S' and cause = 'misrouting'")
    assert m["sub_kind"] == "speed_blind"
