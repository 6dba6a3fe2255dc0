"""Requests decided at the very instant of a decision: which of them the true state at that
decision counts on a candidate replica. The same router's pending totals order its decisions
(each adds one assignment); on the replica that ran the request its queue order does; a request
of another router counts. A request the same router decided at that instant with nothing to
order the two (a router without pending correction records no pending, or the same total) does
not count on another replica: nothing says it came first. Hand-built marts as in
test_attribution (every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

from typing import Any

import pytest
from test_attribution import Fleet, rows, seen


def same_instant_fleet(*, y_router: str, s_pending: int | None,
                       y_pending: int | None) -> dict[str, Any]:
    """S goes to the idle A at t=0; at the same instant Y (3000 tokens) goes to B, idle before,
    decided by ``y_router`` (S's router is r1). Each decision records ``*_pending`` as the
    pending count of its candidate B (None: not recorded). S's candidate B as the true state
    rebuilds it."""
    f = Fleet()

    def candidates(pending: int | None) -> list[dict[str, Any]]:
        extra = {} if pending is None else {"pending": pending}
        return [{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 0, **extra)}]

    f.decision("Y", at_ms=0.0, chosen="B", router=y_router, policy="round_robin",
               reason="round_robin", candidates=candidates(y_pending))
    f.served("Y", "B", arrive=0.0, queue=0.0, input_tokens=3000)
    f.decision("S", at_ms=0.0, chosen="A", router="r1", policy="round_robin",
               reason="round_robin", candidates=candidates(s_pending))
    f.served("S", "A", arrive=0.0, queue=0.0, input_tokens=2500)
    (b,) = rows(f.store(), "select true_waiting + true_running as present, wait_est_ms from "
                           "int_attr_candidates_estimated where request_key = 'k-S' and replica = 'B'")
    return b


@pytest.mark.parametrize(("s_pending", "y_pending"), [(None, None), (0, 0)])
def test_the_same_routers_unordered_decision_is_not_counted_elsewhere(
        s_pending: int | None, y_pending: int | None) -> None:
    """r1 decided Y and S at one instant and recorded no pending total that orders them: B,
    where Y went, was idle for all S's decision says (Y's 3000 ms of prefill is not its
    wait)."""
    b = same_instant_fleet(y_router="r1", s_pending=s_pending, y_pending=y_pending)
    assert b == {"present": 0, "wait_est_ms": 0.0}


@pytest.mark.parametrize(("s_pending", "y_pending", "present"), [(1, 0, 1), (0, 1, 0)])
def test_pending_totals_order_the_same_routers_decisions(
        s_pending: int, y_pending: int, present: int) -> None:
    """With pending totals the smaller came first: Y (0 pending) before S (1) is on B at S's
    decision, Y after S is not."""
    b = same_instant_fleet(y_router="r1", s_pending=s_pending, y_pending=y_pending)
    assert b["present"] == present
    assert b["wait_est_ms"] == pytest.approx(3000.0 * present, abs=1.0)


def test_another_routers_decision_at_the_same_instant_counts() -> None:
    """Y decided by another router at S's instant: it counts on B (its 3000 ms of prefill are
    B's wait for S)."""
    b = same_instant_fleet(y_router="r2", s_pending=None, y_pending=None)
    assert b["present"] == 1
    assert b["wait_est_ms"] == pytest.approx(3000.0, abs=1.0)
