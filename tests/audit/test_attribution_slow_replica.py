"""A slow replica's speed is measured on its prefills that ran alone, against the run's idle
fit: a fit or ratio over every prefill also learns the steps shared with other work, which a
slow replica, holding its work longer, has more of. Hand-built marts as in test_attribution:
a prefill that runs alone takes 1 ms per uncached token on a nominal replica."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from test_attribution import Fleet, primary, rows, seen

NOMINAL = ("B", "C", "D", "E")


def slow_fleet(speed: float = 0.4, pairs: bool = True) -> Fleet:
    """A runs at ``speed`` (0.4x: six prompts alone at 2.5 ms/token, and with ``pairs`` two
    pairs sharing every step at 5 ms/token each; over every prefill A looks 3.1x slower than
    the others); B..E ran six prompts alone each at 1 ms/token."""
    slow = 1.0 / speed
    f = Fleet()
    replicas = ("A", *NOMINAL)
    for k in range(6):
        tokens = 400 + 200 * k
        for n, replica in enumerate(replicas):
            rid = f"solo{replica}{k}"
            t = -400_000.0 + 50_000.0 * k + 5_000.0 * n
            f.decision(rid, at_ms=t, chosen=replica, policy="round_robin", reason="round_robin",
                       candidates=[{"replica": r, **seen(0, 0)} for r in replicas])
            e = f.served(rid, replica, arrive=t, queue=0.0, input_tokens=tokens)
            if replica == "A":
                e.update(prefill_ms=slow * tokens, ttft_ms=slow * tokens)
                f.rows["requests"][-1].update(replica_ttft_ms=slow * tokens,
                                              ttft_ms=slow * tokens + 20.0)
    for k in (0, 5) if pairs else ():
        tokens = 400 + 200 * k
        for j in range(2):
            f.served_took(f"pairA{k}{j}", "A", arrive=-390_000.0 + 50_000.0 * k, queue=0.0,
                          input_tokens=tokens, prefill_ms=2 * slow * tokens,
                          ttft_ms=2 * slow * tokens)
    return f


def estimate_of_s(con: duckdb.DuckDBPyConnection, replica: str) -> dict[str, Any]:
    """S's candidate ``replica``: its speed, where the speed came from, and its wait."""
    (row,) = rows(con, "select speed_factor, speed_from, wait_nominal_ms, wait_est_ms "
                       "from int_attr_candidates_estimated where request_key = 'k-S' "
                       "and replica = ?", [replica])
    return row


def test_a_slow_replicas_speed_comes_from_its_prefills_alone() -> None:
    """S (1200 tokens) went to the idle A and took 3000 ms, 2.5x the prompt alone elsewhere:
    A runs at about 0.4 of the fleet's speed, and slow_replica saves about 60 % of its TTFT.
    Over every prefill A looks 3.1x slower (speed 0.32, a saving of 68 %)."""
    f = slow_fleet()
    for replica in NOMINAL:  # busy enough that no alternative saves as much
        f.backlog(replica, 3, tokens=1000, prefix=f"q{replica}")
    f.decision("S", at_ms=100.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": r, **seen(0, 0)} for r in ("A", *NOMINAL)])
    f.served_took("S", "A", arrive=100.0, queue=0.0, input_tokens=1200,
                  prefill_ms=3000.0, ttft_ms=3000.0)
    con = f.store()
    a = estimate_of_s(con, "A")
    assert a["speed_from"] == "solo_prefills"
    # the idle fit learns A's points scaled by its ratio over every prefill: a little below 2.5
    assert 1.0 / a["speed_factor"] == pytest.approx(0.4, abs=0.025)
    b = estimate_of_s(con, "B")
    assert b["speed_from"] == "solo_prefills"
    # (A's points, scaled down by 3.1 instead of 2.5, pull the idle fit below 1 ms/token)
    assert b["speed_factor"] == pytest.approx(1.0, abs=0.08)
    # a nominal replica's wait is in the router's units as it is
    assert b["wait_nominal_ms"] == b["wait_est_ms"]
    (s,) = rows(con, "select * from attributions where request_id = 'S' "
                     "and cause = 'slow_replica'")
    assert s["excess_ms"] == pytest.approx(3000.0 * 0.6, rel=0.05)
    assert s["excess_ms"] < 3000.0 * (1.0 - 1.0 / 3.1)
    assert s["evidence"].startswith("A runs at 0.")
    assert "of the fleet's speed: its prefills that ran alone took" in s["evidence"]
    assert primary(con, "S")["cause"] == "slow_replica"


def test_a_slow_replicas_longer_wait_is_its_speed_not_a_stale_view() -> None:
    """A held one 1000-token prompt (2500 ms at its speed) and the router saw it, estimating
    1000 ms of queue in its own units; B held two and the router saw them too (2000 ms). The
    qp_cost router chose A. On the true state, in the router's units, A still had the shorter
    queue: not stale telemetry, though A's wait in ms (2500) exceeds the router's 1000 ms."""
    f = slow_fleet()
    f.served_took("qA0", "A", arrive=0.0, queue=0.0, input_tokens=1000,
                  prefill_ms=2500.0, ttft_ms=2500.0)
    f.backlog("B", 2, tokens=1000, prefix="qB")
    for replica in ("C", "D", "E"):
        f.backlog(replica, 3, tokens=1000, prefix=f"q{replica}")
    view = {"A": (1000.0, 0, 1), "B": (2000.0, 1, 1), "C": (3000.0, 2, 1), "D": (3000.0, 2, 1),
            "E": (3000.0, 2, 1)}
    f.decision("S", at_ms=10.0, chosen="A", policy="qp_cost", reason="min_queue_plus_prefill",
               candidates=[{"replica": r, **seen(w, run), "est_queue_ms": q,
                            "est_prefill_ms": 500.0}
                           for r, (q, w, run) in view.items()])
    f.served_took("S", "A", arrive=10.0, queue=2490.0, input_tokens=200,
                  prefill_ms=500.0, ttft_ms=2990.0)
    con = f.store()
    a = estimate_of_s(con, "A")
    assert a["wait_est_ms"] == pytest.approx(2490.0, abs=1.0)
    assert a["wait_nominal_ms"] == pytest.approx(a["wait_est_ms"] / a["speed_factor"])
    causes = {r["cause"] for r in rows(con, "select cause from attributions "
                                            "where request_id = 'S'")}
    assert "stale_telemetry" not in causes
    (p,) = rows(con, "select policy_true_replica from int_attr_requests_placed "
                     "where request_key = 'k-S'")
    assert p["policy_true_replica"] == "A"


@pytest.mark.parametrize(("speed", "is_slow"), [(0.75, True), (0.8, True), (0.9, False)])
def test_a_replica_is_slow_below_the_speed_where_its_slowness_is_a_significant_cause(
        speed: float, is_slow: bool) -> None:
    """The bar is a speed of 0.85 (``slow_replica_ratio`` 1 / 0.85), 1 - cause_min_frac, as
    the testbed's ground truth (LabelConfig.slow_replica_speed): below it the slowness alone
    costs every request on the replica a significant share of its TTFT. S (2400 tokens) went to
    the idle A; the alternatives are busy. At 0.75x and 0.8x slow_replica is S's primary cause,
    sized TTFT x (1 - speed); at 0.9x A is not slow (its slowness would be below the bar)."""
    f = slow_fleet(speed, pairs=False)
    for replica in NOMINAL:
        f.backlog(replica, 3, tokens=2000, prefix=f"q{replica}")
    ttft = 2400.0 / speed
    f.decision("S", at_ms=100.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": r, **seen(0, 0)} for r in ("A", *NOMINAL)])
    f.served_took("S", "A", arrive=100.0, queue=0.0, input_tokens=2400,
                  prefill_ms=ttft, ttft_ms=ttft)
    con = f.store()
    a = estimate_of_s(con, "A")
    assert a["speed_from"] == "solo_prefills"
    assert 1.0 / a["speed_factor"] == pytest.approx(speed, abs=0.03)
    slow = rows(con, "select excess_ms from attributions where request_id = 'S' "
                     "and cause = 'slow_replica'")
    if is_slow:
        assert slow and slow[0]["excess_ms"] == pytest.approx(ttft * (1.0 - speed), rel=0.1)
        assert primary(con, "S")["cause"] == "slow_replica"
    else:
        assert not slow
