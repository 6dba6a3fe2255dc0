"""Slowness first (docs/attribution.md, "One principle"): on a slow replica the routing causes
are credited only with what an alternative would have saved beyond the replica's slowness,
from the TTFT there at the fleet's speed (the replica's measured speed times its TTFT, the
counterfactual slow_replica is sized from); the slowness itself is slow_replica's. The two
savings then split what moving the request would have saved. Hand-built marts as in
test_attribution_slow_replica: A runs at 0.4x, B..E at the fleet's speed."""

from __future__ import annotations

import pytest
from test_attribution import primary, rows, seen
from test_attribution_slow_replica import NOMINAL, estimate_of_s, slow_fleet


def test_routing_on_a_slow_replica_is_credited_beyond_its_slowness() -> None:
    """A held two 1000-token prompts (2500 ms each at its speed) and the load-blind router saw
    them; it sent S (1200 tokens) there anyway: 4990 ms of queue and 3000 ms of prefill, 7990 ms
    where the idle B would have taken about 1200. Of the 6,800 ms a move to B saves, A's
    slowness explains 60 % of 7990 ms (slow_replica, primary); misrouting has the rest, what B
    saves against A's TTFT at the fleet's speed (about 3200 ms less B's 1200). Sized from the
    TTFT as measured, misrouting (6,800 ms) would be primary."""
    f = slow_fleet()
    f.served_took("qA0", "A", arrive=0.0, queue=0.0, input_tokens=1000,
                  prefill_ms=2500.0, ttft_ms=2500.0)
    f.served_took("qA1", "A", arrive=0.0, queue=2500.0, input_tokens=1000,
                  prefill_ms=2500.0, ttft_ms=5000.0)
    f.decision("S", at_ms=10.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(1, 1)},
                           *({"replica": r, **seen(0, 0)} for r in NOMINAL)])
    f.served_took("S", "A", arrive=10.0, queue=4990.0, input_tokens=1200,
                  prefill_ms=3000.0, ttft_ms=7990.0)
    con = f.store()
    speed = 1.0 / estimate_of_s(con, "A")["speed_factor"]
    assert speed == pytest.approx(0.4, abs=0.025)
    (placed,) = rows(con, "select a_ttft_est_ms from int_attr_requests_placed "
                          "where request_key = 'k-S'")
    alt = placed["a_ttft_est_ms"]
    assert alt == pytest.approx(1200.0, rel=0.1)
    excess = {r["cause"]: r["excess_ms"]
              for r in rows(con, "select cause, excess_ms from attributions "
                                 "where request_id = 'S'")}
    assert "stale_telemetry" not in excess
    # routing beyond the slowness: from A's TTFT at the fleet's speed
    assert excess["misrouting"] == pytest.approx(7990.0 * speed - alt, abs=0.2)
    assert excess["slow_replica"] == pytest.approx(7990.0 * (1.0 - speed), abs=0.2)
    # the two split what the move to B would have saved
    assert excess["misrouting"] + excess["slow_replica"] == pytest.approx(7990.0 - alt, abs=0.3)
    p = primary(con, "S")
    assert p["cause"] == "slow_replica"
    # the routing evidence says where its saving starts
    (m,) = rows(con, "select evidence from attributions where request_id = 'S' "
                     "and cause = 'misrouting'")
    assert "beyond the slowness" in m["evidence"]


def test_routing_on_a_nominal_replica_is_sized_from_its_ttft() -> None:
    """The same decision with S on the nominal B, behind the same work there (two 1000-token
    prompts at 1000 ms each): no slowness to take first, misrouting is the whole saving."""
    f = slow_fleet()
    f.backlog("B", 2, tokens=1000, prefix="qB")
    f.decision("S", at_ms=10.0, chosen="B", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "B", **seen(1, 1)},
                           *({"replica": r, **seen(0, 0)} for r in ("C", "D", "E"))])
    f.served_took("S", "B", arrive=10.0, queue=1990.0, input_tokens=1200,
                  prefill_ms=1200.0, ttft_ms=3190.0)
    con = f.store()
    (placed,) = rows(con, "select a_ttft_est_ms from int_attr_requests_placed "
                          "where request_key = 'k-S'")
    p = primary(con, "S")
    assert p["cause"] == "misrouting"
    assert p["excess_ms"] == pytest.approx(3190.0 - placed["a_ttft_est_ms"], abs=0.2)
    assert "beyond the slowness" not in p["evidence"]
    causes = {r["cause"] for r in rows(con, "select cause from attributions "
                                            "where request_id = 'S'")}
    assert "slow_replica" not in causes
