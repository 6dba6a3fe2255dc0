"""A Q + P policy replayed on the true state keeps its own cost model where its view was the
true state: a candidate the router saw right (the same waiting and running, nothing pending,
sampled less than misroute_min_ms before the decision) keeps the queue estimate the router
made of it; the audit's measured wait stands in only where the view differed. Otherwise the
router's error in estimating work it saw right would pass for a stale view. Hand-built marts
as in test_attribution (every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

from typing import Any

import pytest
from test_attribution import Fleet, at, primary, rows, seen


def qp_fleet(b_view: dict[str, Any]) -> Fleet:
    """A had a 3000-token prompt prefilling since t=0, which the router did not see (A idle,
    queue estimate 0); B had one request decoding (its first token long past), its view
    ``b_view``, and the router's own cost model put 5000 ms of queue on it. On its Q + P the
    router sent S (1000 tokens, nothing cached) to A at t=100: S waited 2900 ms for A's prompt
    (TTFT 3900 ms) where B would have started it at once (1000 ms)."""
    f = Fleet()
    f.served("a0", "A", arrive=0.0, queue=0.0, input_tokens=3000)
    b0 = f.served("b0", "B", arrive=-1000.0, queue=0.0, input_tokens=500)
    b0.update(decode_ms=10_000.0, end_at=at(-1000.0 + 500.0 + 10_000.0))
    f.decision("S", at_ms=100.0, chosen="A", policy="qp_cost", reason="min_queue_plus_prefill",
               candidates=[
                   {"replica": "A", "predicted_cached_tokens": 0, **seen(0, 0),
                    "est_queue_ms": 0.0, "est_prefill_ms": 1000.0, "score": 1000.0},
                   {"replica": "B", "predicted_cached_tokens": 0, **b_view,
                    "est_queue_ms": 5000.0, "est_prefill_ms": 1000.0, "score": 6000.0},
               ])
    f.served("S", "A", arrive=100.0, queue=2900.0, input_tokens=1000)
    return f


def test_a_queue_estimate_made_on_the_true_state_is_replayed_as_the_router_made_it() -> None:
    """The router saw B right (0 waiting, 1 running, 50 ms before): its 5000 ms on B is what
    its policy computes on B's true state. With A's true wait (2900 ms) the policy still
    chooses A (3900 < 6000 ms): the view did not flip the choice, the router's estimate of B
    did. Misrouting (its own estimate), sized by what B saves, not stale telemetry."""
    con = qp_fleet(seen(0, 1)).store()
    (placed,) = rows(con, "select chosen_replica, policy_true_replica "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed == {"chosen_replica": "A", "policy_true_replica": "A"}
    p = primary(con, "S")
    assert p["cause"] == "misrouting"
    assert p["sub_kind"] == "policy_estimate"
    assert p["excess_ms"] == pytest.approx(2900.0, abs=1.0)
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "stale_telemetry" not in causes


@pytest.mark.parametrize("b_view", [
    pytest.param(seen(0, 1, age=500.0), id="sampled_500_ms_before"),
    pytest.param(seen(0, 1, pending=1), id="one_assignment_pending"),
    pytest.param(seen(1, 1), id="one_waiting_that_had_left"),
])
def test_a_queue_estimate_on_another_view_is_replaced_by_the_true_wait(
        b_view: dict[str, Any]) -> None:
    """Where the router's view of B was not B's true state (an older sample, an assignment it
    counted as pending, a count that differed), its estimate of B is not what the policy would
    compute on the true state: B is replayed on its true wait (0 ms), the policy chooses B,
    which met the SLO, and the view of A (idle for a replica prefilling 2900 ms more) flipped
    the choice: stale telemetry."""
    con = qp_fleet(b_view).store()
    (placed,) = rows(con, "select policy_true_replica "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed == {"policy_true_replica": "B"}
    p = primary(con, "S")
    assert p["cause"] == "stale_telemetry"
    assert " would have chosen B: " in p["evidence"]
    assert p["excess_ms"] == pytest.approx(2900.0, abs=1.0)
