"""Evidence for every alternative, and the counterfactual of the router's own policy.

An alternative's cache is what its own history of the prompt's prefix blocks shows (not the
router's prediction) when the decision carries prefix hashes; stale telemetry is decided by
re-running the router's policy on the true state at the decision instant. Hand-built marts as
in test_attribution (every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

import pytest
from test_attribution import Fleet, at, load_blind_fleet, primary, rows, seen


def prefix_fleet(*, b_served_prefix: bool, b_predicted: int, p0_at: float = -10_000.0) -> Fleet:
    """S (2000 tokens, 4 prefix blocks) goes to the idle A, which holds none of it: 2000 ms of
    prefill, over the 2000 ms SLO. B is idle too; p0, served on B 10 s earlier, shared the
    first two blocks (when ``b_served_prefix``) or none. The router predicted ``b_predicted``
    cached tokens on B (a prefix index remembering only the last replica per prefix predicts 0
    where B held it; one that outlived an eviction predicts tokens B did not hold)."""
    f = Fleet()
    f.served("p0", "B", arrive=p0_at, queue=0.0, input_tokens=1000)
    f.decision("p0", at_ms=p0_at, chosen="B", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
    f.prefixes.append(("p0", ["h1", "h2"] if b_served_prefix else ["z1", "z2"]))
    f.prefixes.append(("S", ["h1", "h2", "h3", "h4"]))
    f.decision("S", at_ms=0.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[
                   {"replica": "A", "predicted_cached_tokens": 0, **seen(0, 0)},
                   {"replica": "B", "predicted_cached_tokens": b_predicted, **seen(0, 0)},
               ])
    f.served("S", "A", arrive=5.0, queue=0.0, input_tokens=2000, cached=0)
    return f


def test_an_alternative_holding_the_prefix_is_seen_from_its_history() -> None:
    """The router predicted B cold; B's history shows it held half the prompt (2 of 4 blocks):
    1000 ms there instead of 2000 ms. (On the router's prediction B looked no better than A.)"""
    con = prefix_fleet(b_served_prefix=True, b_predicted=0).store()
    (b,) = rows(con, "select cached_assumed_tokens, cache_source, prefix_held_blocks "
                     "from int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b == {"cached_assumed_tokens": 1000, "cache_source": "prefix_history",
                 "prefix_held_blocks": 2}
    p = primary(con, "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "cache_blind")
    assert p["excess_ms"] == pytest.approx(1000.0, abs=1.0)
    assert "(1000 cached, from prefix history; load from executions)" in p["evidence"]


def test_prefix_service_long_before_the_decision_is_not_evidence() -> None:
    """p0 shared the prefix on B 60 s before S: a busy replica's prefix cache has turned over
    since, so B counts as cold (and the choice of A is not a misroute)."""
    con = prefix_fleet(b_served_prefix=True, b_predicted=0, p0_at=-60_000.0).store()
    (b,) = rows(con, "select cached_assumed_tokens, prefix_held_blocks "
                     "from int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b == {"cached_assumed_tokens": 0, "prefix_held_blocks": 0}
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "misrouting" not in causes


def test_a_prefix_an_execution_still_running_there_prefilled_is_held() -> None:
    """p0 shared S's first two blocks on B 60 s before S, and was still decoding there at S's
    decision: its blocks were referenced, and a referenced block is never evicted, however
    long ago it was prefilled and whatever B allocated since. B held half the prompt."""
    f = prefix_fleet(b_served_prefix=True, b_predicted=0, p0_at=-60_000.0)
    p0 = next(e for e in f.rows["executions"] if e["request_id"] == "p0")
    p0.update(end_at=at(-60_000.0 + p0["ttft_ms"] + 70_000.0), decode_ms=70_000.0,
              e2e_ms=p0["ttft_ms"] + 70_000.0)
    con = f.store()
    (b,) = rows(con, "select cached_assumed_tokens, prefix_held_blocks "
                     "from int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b == {"cached_assumed_tokens": 1000, "prefix_held_blocks": 2}
    assert (primary(con, "S")["cause"], primary(con, "S")["sub_kind"]) == (
        "misrouting", "cache_blind")


def _b_after_turnover(b_turnover: int, c_kv_usage: float) -> dict[str, object]:
    """S's cache on B, idle (no KV usage to size its pool), which served S's first two blocks
    60 s before S and, 50 s before, ``b_turnover`` tokens of another prompt (none at 0); C,
    another candidate, held 10,000 tokens at ``c_kv_usage`` as the router saw it."""
    f = prefix_fleet(b_served_prefix=True, b_predicted=0, p0_at=-60_000.0)
    if b_turnover:
        f.served("q1", "B", arrive=-50_000.0, queue=0.0, input_tokens=b_turnover)
    f.served("c0", "C", arrive=-1_000.0, queue=0.0, input_tokens=10_000)
    f.rows["candidates"].append({**f.rows["candidates"][-1], "replica": "C", **seen(0, 1),
                                 "kv_usage": c_kv_usage})
    (b,) = rows(f.store(), "select cached_assumed_tokens, prefix_held_blocks from "
                           "int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    return b


def _b_held(held: bool) -> dict[str, int]:
    """B's row when it held S's two served blocks (1,000 of S's tokens), and when it did not."""
    return ({"cached_assumed_tokens": 1000, "prefix_held_blocks": 2} if held
            else {"cached_assumed_tokens": 0, "prefix_held_blocks": 0})


@pytest.mark.parametrize(("b_turnover", "held"), [(0, True), (30_000, False)])
def test_an_idle_alternatives_pool_is_sized_from_the_decisions_other_candidates(
        b_turnover: int, held: bool) -> None:
    """B, idle (no KV usage to size its pool), served S's first two blocks 60 s before S. C,
    another candidate, held 10,000 tokens at a KV usage of 0.5 the router saw: a pool of
    20,000 tokens. Sized so, B's cache held the prefix when it allocated nothing since
    (instead of the 30 s rule of an unsized pool), and not when 30,000 tokens of another
    prompt were released there since, more than its 20,000-token pool."""
    assert _b_after_turnover(b_turnover, c_kv_usage=0.5) == _b_held(held)


@pytest.mark.parametrize(("b_turnover", "held"), [(400_000, True), (600_000, False)])
def test_a_nearly_idle_fleets_pool_is_sized_from_the_usage_it_was_seen_at(
        b_turnover: int, held: bool) -> None:
    """No candidate was seen at a KV usage of 0.05 or more: C held 10,000 tokens at 0.02, a
    pool of 500,000 tokens, B's alike. B served S's first two blocks 60 s before S and is
    prefilling a prompt admitted since: held while that prompt leaves room in the pool for the
    prefix (400,000 tokens), not when it fills more than the pool (600,000), instead of the
    30 s rule of an unsized pool either way."""
    assert _b_after_turnover(b_turnover, c_kv_usage=0.02) == _b_held(held)


def test_a_shorter_prefix_served_since_is_held_when_the_longer_one_is_not() -> None:
    """B served three of S's blocks 60 s before S (turned over since) and, 10 s before, a
    prompt sharing only the first: B held one block of four, 500 of S's 2000 tokens. (The
    deepest block B ever served is not held, so the shorter ones are looked up too.)"""
    f = prefix_fleet(b_served_prefix=False, b_predicted=0)
    f.served("p1", "B", arrive=-60_000.0, queue=0.0, input_tokens=1500)
    f.decision("p1", at_ms=-60_000.0, chosen="B", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0)}])
    f.prefixes.append(("p1", ["h1", "h2", "h3"]))
    f.prefixes.remove(("p0", ["z1", "z2"]))
    f.prefixes.append(("p0", ["h1", "y2"]))
    con = f.store()
    (b,) = rows(con, "select cached_assumed_tokens, cache_source, prefix_held_blocks "
                     "from int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b == {"cached_assumed_tokens": 500, "cache_source": "prefix_history",
                 "prefix_held_blocks": 1}


def test_a_predicted_hit_the_alternative_never_held_is_not_trusted() -> None:
    """The router predicted 1000 tokens on B, but B never served any of the prompt's blocks:
    B would have prefilled all 2000 tokens too, so the choice of A cost nothing."""
    con = prefix_fleet(b_served_prefix=False, b_predicted=1000).store()
    (b,) = rows(con, "select cached_assumed_tokens, cache_source "
                     "from int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b == {"cached_assumed_tokens": 0, "cache_source": "prefix_history"}
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "misrouting" not in causes


def test_without_prefix_hashes_the_alternative_keeps_the_routers_prediction() -> None:
    f = prefix_fleet(b_served_prefix=True, b_predicted=600)
    f.prefixes.clear()
    con = f.store()
    (b,) = rows(con, "select cached_assumed_tokens, cache_source "
                     "from int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    assert b == {"cached_assumed_tokens": 600, "cache_source": "router_prediction"}
    p = primary(con, "S")
    assert "from router prediction" in p["evidence"]


def test_cache_aware_on_the_true_state_would_have_chosen_the_same_replica() -> None:
    """The router saw A idle (true: 10 queued); B idle. But cache_aware at its thresholds (no
    imbalance below 64 requests; A's predicted match 50 % > 30 %) sends S to A on the true
    state too: the view did not change the choice, the policy did. Misrouting, not stale
    telemetry."""
    con = load_blind_fleet(router_saw_waiting=0, router_saw_running=0).store()
    (placed,) = rows(con, "select policy_true_replica from int_attr_requests_placed "
                          "where request_key = 'k-S'")
    assert placed["policy_true_replica"] == "A"
    p = primary(con, "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "load_blind")
    assert "would have chosen A" in p["evidence"]


def test_cache_aware_thresholds_decide_the_true_state_choice() -> None:
    """The same decision with an imbalance threshold of 5 requests: on the true state (10 vs 0)
    cache_aware balances to B, so the stale view flipped the choice."""
    con = load_blind_fleet(router_saw_waiting=0, router_saw_running=0).store()
    con.execute("set variable routeaudit_cache_aware_balance_abs = 5")
    p = primary(con, "S")
    assert (p["cause"], p["sub_kind"]) == ("stale_telemetry", "unreflected_load")
    assert "on the true state its policy (cache_aware) would have chosen B" in p["evidence"]
    # what its own true-state choice saves: B takes 1000 ms instead of 10400 ms
    assert p["excess_ms"] == pytest.approx(9400.0, abs=1.0)


def test_power_of_two_is_replayed_on_the_pair_it_sampled() -> None:
    """power_of_two sampled A and C (the candidates it scored) and took A, whose work it saw as
    the smaller. On the true state it would have taken C, not the equally idle B it never
    sampled."""
    f = Fleet()
    f.backlog("A", 10)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.served("c0", "C", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("S", at_ms=100.0, chosen="A", policy="power_of_two", reason="power_of_two",
               candidates=[
                   {"replica": "A", "score": 0.0, **seen(0, 0)},
                   {"replica": "B", **seen(0, 0)},
                   {"replica": "C", "score": 500.0, **seen(1, 0)},
               ])
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000)
    con = f.store()
    p = primary(con, "S")
    assert p["cause"] == "stale_telemetry"
    assert "its policy (power_of_two) would have chosen C" in p["evidence"]


def test_a_replay_contradicting_the_recorded_choice_is_not_used() -> None:
    """A least_load router whose recorded scores say B was the least loaded chose A: the audit
    does not know this policy after all, so it does not claim what it would have chosen."""
    f = Fleet()
    f.backlog("A", 10)
    f.served("b0", "B", arrive=-20_000.0, queue=0.0, input_tokens=800)
    f.decision("S", at_ms=100.0, chosen="A", policy="least_load", reason="least_load",
               candidates=[
                   {"replica": "A", "score": 900.0, **seen(0, 0)},
                   {"replica": "B", "score": 100.0, **seen(0, 0)},
               ])
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000)
    con = f.store()
    (placed,) = rows(con, "select policy_true_replica from int_attr_requests_placed "
                          "where request_key = 'k-S'")
    assert placed["policy_true_replica"] is None
    p = primary(con, "S")
    assert "its policy" not in p["evidence"]
