"""A scheduler that admits a request at once and shares its prefill steps with the work present
shows the request's wait as a longer prefill, not as a queue. That stretch, as far as the work
present at the decision explains it, is the request's own wait for the overload rule; a request
that neither queued nor was stretched by that work never gets overload. Hand-built marts as in
test_attribution_estimates: a prefill that runs alone takes 1 ms per uncached token."""

from __future__ import annotations

import duckdb
import pytest
from test_attribution import primary, rows, seen
from test_attribution_estimates import calibrated_fleet


def both_busy_admitted_at_once(s_prefill_ms: float) -> duckdb.DuckDBPyConnection:
    """P and Q (1500 tokens each) were prefilling on A and B, alone, when S (1000 tokens) went
    to A at t=1000 ms: both replicas had 1450 ms of work ahead of S. A admitted S at once
    (queue 0) and S's prefill took `s_prefill_ms`."""
    f = calibrated_fleet()
    # both replicas went through the same before: they prefill at the same speed
    for replica in ("A", "B"):
        for rid, tokens, ms in ((f"{replica}1", 1500, 1500.0), (f"{replica}2", 1000, 2500.0)):
            e = f.served(rid, replica, arrive=-30_000.0, queue=0.0, input_tokens=tokens)
            e.update(prefill_ms=ms, ttft_ms=ms)
    f.served("P", "A", arrive=950.0, queue=0.0, input_tokens=1500)
    f.served("Q", "B", arrive=950.0, queue=0.0, input_tokens=1500)
    f.decision("S", at_ms=1000.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 1)}, {"replica": "B", **seen(0, 1)}])
    f.served_took("S", "A", arrive=1000.0, queue=0.0, input_tokens=1000,
                  prefill_ms=s_prefill_ms, ttft_ms=s_prefill_ms)
    return f.store()


def test_a_prefill_stretched_by_the_work_present_is_the_requests_wait() -> None:
    """S's prefill took 2500 ms instead of 1000 alone: 1450 ms of it is the wait P put on it
    (the most the work present could have made it wait). B was as busy, so no placement would
    have saved that wait: overload, sized at the shortest wait, 1450 ms."""
    con = both_busy_admitted_at_once(2500.0)
    (placed,) = rows(con, "select exec_queue_ms, exec_load_stretch_ms "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed["exec_queue_ms"] == pytest.approx(0.0)
    assert placed["exec_load_stretch_ms"] == pytest.approx(1450.0, abs=1.0)
    p = primary(con, "S")
    assert p["cause"] == "overload"
    assert p["excess_ms"] == pytest.approx(1450.0, abs=1.0)
    assert "stretched 1450 ms" in p["evidence"]


def test_no_overload_when_the_prefill_was_not_stretched_by_the_work_present() -> None:
    """The same busy replicas, but S's 1000-token prefill took 1000 ms, as alone: it neither
    queued nor shared its steps with P, so the load cost it nothing, whatever the replicas
    held; with the SLO lowered below its TTFT the rules have a request to judge."""
    con = both_busy_admitted_at_once(1000.0)
    (placed,) = rows(con, "select exec_load_stretch_ms from int_attr_requests_placed "
                          "where request_key = 'k-S'")
    assert placed["exec_load_stretch_ms"] == pytest.approx(0.0, abs=20.0)
    con.execute("set variable routeaudit_ttft_slo_ms = 500")
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "overload" not in causes
