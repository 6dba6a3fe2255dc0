"""A router-declared score replayed on the true state.

A router whose policy is none of the named ones but which records a score for every candidate
is replayed through the view quantity that ranks the candidates as its scores do: the same
quantity on the true state gives the policy's own true-state choice. Hand-built marts as in
test_attribution (every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

from typing import Any

import pytest
from test_attribution import Fleet, primary, rows, seen


def custom_score_fleet(scores: dict[str, float]) -> Fleet:
    """A custom-policy router (``my_policy``) sends S (1000 tokens) to A at t=100 on a stale
    view. It saw (waiting, running): A (1, 0), B (0, 3), C (2, 3), D (4, 3), and recorded
    ``scores``. The truth at t=100: A has 10 prompts of 1000 tokens queued since t=0 (10
    requests, S waits 9900 ms); B has 3 (3 requests); C runs two requests that had their
    first token long ago (2 requests, nothing to wait for); D prefills one 3000-token prompt
    (1 request, first token at t=3000). On the true state, fewest waiting + running is D
    (est 2900 + 1000 ms), the lowest estimated TTFT is C (1000 ms)."""
    f = Fleet()
    f.backlog("A", 10)
    f.backlog("B", 3, prefix="qb")
    for i in range(2):
        e = f.execution(f"c{i}", "C", arrive=-1000.0, queue=0.0, input_tokens=100,
                        decode=10_000.0)
        f.request(f"c{i}", start=-1010.0, ttft=e["ttft_ms"] + 20, input_tokens=100,
                  replica="C", replica_ttft=e["ttft_ms"], actual=0)
    f.served("d0", "D", arrive=0.0, queue=0.0, input_tokens=3000)
    view = {"A": seen(1, 0), "B": seen(0, 3), "C": seen(2, 3), "D": seen(4, 3)}
    f.decision("S", at_ms=100.0, chosen="A", policy="my_policy", reason="my_score",
               candidates=[{"replica": r, "score": scores[r], **view[r]} for r in "ABCD"])
    f.served("S", "A", arrive=100.0, queue=9900.0, input_tokens=1000)
    return f


def placed(con: Any) -> dict[str, Any]:
    (row,) = rows(con, "select policy_true_replica, policy_true_ttft_est_ms, "
                       "policy_score_replayed_as, policy_score_not_replayed "
                       "from int_attr_requests_placed where request_key = 'k-S'")
    return row


@pytest.mark.parametrize(("scores", "replayed_as"), [
    ({"A": 1.0, "B": 3.0, "C": 5.0, "D": 7.0}, "linear in"),
    ({"A": -1.0, "B": -3.0, "C": -5.0, "D": -7.0}, "linear in"),
    ({"A": 1.0, "B": 9.0, "C": 25.0, "D": 49.0}, "ranked as"),
], ids=["lower_is_better", "higher_is_better", "ranking_only"])
def test_scores_following_waiting_plus_running_are_replayed_on_the_true_state(
        scores: dict[str, float], replayed_as: str) -> None:
    """The scores are waiting + running as the router saw them (1, 3, 5, 7), their negation
    with the highest score chosen, or their squares (the same ranking, linear in nothing).
    Waiting alone (1, 0, 2, 4) ranks B before A, so only the request counts reproduce them: on
    the true state the policy picks D, the replica with fewest requests. Stale telemetry is
    sized by what D saves (10900 - 3900 ms), and misrouting by what C saves beyond D (3900 -
    1000 ms), not by C's saving alone."""
    con = custom_score_fleet(scores).store()
    p = placed(con)
    assert p["policy_true_replica"] == "D"
    assert p["policy_true_ttft_est_ms"] == pytest.approx(3900.0, abs=1.0)
    # the direction is the quantity's: fewer requests first, whichever way the score runs
    assert p["policy_score_replayed_as"] == (
        f"its recorded score {replayed_as} waiting + running, lower first")
    assert p["policy_score_not_replayed"] is None
    causes = {r["cause"]: r for r in rows(con, "select * from attributions "
                                               "where request_id = 'S'")}
    stale = primary(con, "S")
    assert (stale["cause"], stale["sub_kind"]) == ("stale_telemetry", "unreflected_load")
    assert stale["excess_ms"] == pytest.approx(10_920.0 - 20.0 - 3900.0, abs=1.0)
    assert (f"on the true state its policy (my_policy, its recorded score {replayed_as} "
            "waiting + running, lower first) would have chosen D") in stale["evidence"]
    assert causes["misrouting"]["excess_ms"] == pytest.approx(3900.0 - 1000.0, abs=1.0)


def test_scores_no_view_quantity_reproduces_leave_the_policy_unknown() -> None:
    """Scores ranking A, D, B, C follow none of the recorded view quantities: the audit does
    not claim what this policy would have chosen, and the evidence says why."""
    con = custom_score_fleet({"A": 1.0, "B": 5.0, "C": 7.0, "D": 3.0}).store()
    p = placed(con)
    assert p["policy_true_replica"] is None
    assert p["policy_score_replayed_as"] is None
    assert p["policy_score_not_replayed"] == (
        "no view quantity ranks the candidates as its recorded scores do")
    evidence = " ".join(r["evidence"] for r in rows(
        con, "select evidence from attributions where request_id = 'S'"))
    assert "would have chosen" not in evidence
    assert ("its policy (my_policy) not replayed on the true state: no view quantity ranks "
            "the candidates as its recorded scores do") in evidence


@pytest.mark.parametrize(("scores", "why"), [
    ({"A": 1.0, "B": 1.0, "C": 1.0, "D": 1.0}, "its recorded scores were all equal"),
    ({"A": 3.0, "B": 1.0, "C": 5.0, "D": 7.0},
     "the replica it chose had neither the lowest nor the highest recorded score"),
], ids=["all_equal", "chosen_in_the_middle"])
def test_scores_that_do_not_say_which_end_is_better_are_not_replayed(
        scores: dict[str, float], why: str) -> None:
    """Equal scores, or a chosen replica at neither end of them, leave the direction of the
    score unknown: no replay, and the reason is given."""
    p = placed(custom_score_fleet(scores).store())
    assert p["policy_true_replica"] is None
    assert p["policy_score_not_replayed"] == why


def seen_as(f: Fleet, view: dict[str, tuple[int, int]]) -> Fleet:
    """The same fleet with the router's view of (waiting, running) replaced."""
    f.rows["candidates"] = [
        {**c, "waiting": view[c["replica"]][0], "running": view[c["replica"]][1]}
        for c in f.rows["candidates"]]
    return f


AMBIGUOUS_VIEW = {"A": (1, 0), "B": (2, 1), "C": (3, 2), "D": (5, 2)}


def test_quantities_that_disagree_on_the_true_state_leave_the_policy_unknown() -> None:
    """When the router saw (waiting, running) A (1, 0), B (2, 1), C (3, 2), D (5, 2), both
    waiting + running and waiting alone rank the candidates as the scores (1, 9, 25, 49: linear
    in neither) do; on the true state waiting picks C (nothing queued there or on D: C is named
    first) and waiting + running picks D, so the policy's true-state choice is not known."""
    con = seen_as(custom_score_fleet({"A": 1.0, "B": 9.0, "C": 25.0, "D": 49.0}),
                  AMBIGUOUS_VIEW).store()
    p = placed(con)
    assert p["policy_true_replica"] is None
    assert p["policy_score_not_replayed"] == (
        "the view quantities ranking the candidates as its recorded scores do "
        "(waiting + running, waiting) pick different replicas on the true state")


def test_a_score_linear_in_one_quantity_is_replayed_through_that_one() -> None:
    """The same view with scores 1, 3, 5, 7: waiting alone still ranks the candidates alike,
    but the scores are linear in waiting + running only, which decides: D."""
    con = seen_as(custom_score_fleet({"A": 1.0, "B": 3.0, "C": 5.0, "D": 7.0}),
                  AMBIGUOUS_VIEW).store()
    p = placed(con)
    assert p["policy_true_replica"] == "D"
    assert p["policy_score_replayed_as"] == (
        "its recorded score linear in waiting + running, lower first")
