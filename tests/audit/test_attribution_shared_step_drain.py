"""The wait a request owes the work present on the replica that ran it is that work's drain, to its
first tokens. Where that work shared its last steps with the request's own first chunks (a
scheduler that admits at once), its first token came late by the request's own tokens in those
steps: the drain there is at most the time to the request's prefill start plus the prefill that
work had left then, computed alone. Hand-built marts as in test_attribution_estimates: a prefill
that runs alone takes 1 ms per uncached token."""

from __future__ import annotations

import duckdb
import pytest
from test_attribution import rows, seen
from test_attribution_estimates import calibrated_fleet


def small_prompt_ahead_sharing_the_first_step() -> duckdb.DuckDBPyConnection:
    """P (100 tokens) was admitted on A at t=990 ms; S (1500 tokens) went to A at t=1000 and
    was admitted at once: P's last tokens shared a long step with S's first chunk, so P's first
    token came at t=3000 instead of about t=1090. S's prefill took 3000 ms (steps shared with
    other work too). B was busy with Q (2500 tokens, alone, first token at t=3450)."""
    f = calibrated_fleet()
    # both replicas went through the same before: they prefill at the same speed
    for replica in ("A", "B"):
        for rid, tokens, ms in ((f"{replica}1", 1500, 1500.0), (f"{replica}2", 1000, 2500.0)):
            e = f.served(rid, replica, arrive=-30_000.0, queue=0.0, input_tokens=tokens)
            e.update(prefill_ms=ms, ttft_ms=ms)
    f.served_took("P", "A", arrive=990.0, queue=0.0, input_tokens=100,
                  prefill_ms=2010.0, ttft_ms=2010.0)
    f.served("Q", "B", arrive=950.0, queue=0.0, input_tokens=2500)
    f.decision("S", at_ms=1000.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 1)}, {"replica": "B", **seen(0, 1)}])
    f.served_took("S", "A", arrive=1000.0, queue=0.0, input_tokens=1500,
                  prefill_ms=3000.0, ttft_ms=3000.0)
    return f.store()


def test_the_drain_does_not_count_the_requests_own_chunk_in_a_shared_step() -> None:
    """P's first token came 2000 ms after the decision, but 99.5 of its 100 tokens were left
    when S's prefill started (at the decision): alone they take about 100 ms, so that is A's
    drain for S, not 2000 ms of steps that computed mostly S's own tokens. B's drain, measured
    to a first token S had no part in, stays 2450 ms."""
    con = small_prompt_ahead_sharing_the_first_step()
    waits = {r["replica"]: r for r in rows(
        con, "select replica, drain_ms, drain_shared_tokens, wait_est_ms "
             "from int_attr_candidates_estimated where request_key = 'k-S'")}
    assert waits["A"]["drain_ms"] == pytest.approx(2000.0, abs=1.0)
    assert waits["A"]["drain_shared_tokens"] == pytest.approx(99.5, abs=0.1)
    assert waits["A"]["wait_est_ms"] == pytest.approx(99.5, abs=5.0)
    assert waits["B"]["drain_shared_tokens"] is None
    assert waits["B"]["wait_est_ms"] == pytest.approx(2450.0, abs=5.0)


def test_no_overload_from_the_requests_own_chunk_in_the_drain() -> None:
    """S missed the SLO (TTFT 3020 ms) and its prefill ran 1500 ms beyond the prompt alone, but
    the work present at the decision explains about 100 ms of it: that is all the load cost S,
    below overload_min_queue_ms. Measured to P's late first token, the drain let 1500 ms of the
    stretch count as S's wait, and S was judged overload."""
    con = small_prompt_ahead_sharing_the_first_step()
    (placed,) = rows(con, "select exec_queue_ms, exec_load_stretch_ms "
                          "from int_attr_requests_placed where request_key = 'k-S'")
    assert placed["exec_queue_ms"] == pytest.approx(0.0)
    assert placed["exec_load_stretch_ms"] == pytest.approx(99.5, abs=5.0)
    causes = {r["cause"] for r in rows(con, "select cause from attributions where request_id='S'")}
    assert "overload" not in causes
