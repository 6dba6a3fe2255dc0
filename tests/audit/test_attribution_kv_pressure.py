"""An alternative whose KV pool the router saw nearly full: its cache is still its own prefix
history, bounded by the turnover its pool had room for, not by the router's prediction (an
index that remembers only the last replica per prefix predicts 0 on a replica holding it).
Hand-built marts as in test_attribution (every replica prefills at 1 ms per uncached token)."""

from __future__ import annotations

import pytest
from test_attribution import Fleet, primary, rows, seen


def pressured_fleet(*, b_kv_usage: float, b_resident_tokens: int, churn_tokens: int = 0) -> Fleet:
    """S (2000 tokens, 4 prefix blocks) goes to the idle A, which holds none of it: 2000 ms of
    prefill, over the 2000 ms SLO. B served p0 10 s before S, sharing S's first two blocks;
    the router predicted B cold. At S's decision B runs r (``b_resident_tokens`` of prompt,
    admitted before p0, decoding past S) and the router saw B's KV usage at ``b_kv_usage``.
    ``churn_tokens``: a prompt served on B after p0 (new KV allocated there since)."""
    f = Fleet()
    f.execution("r", "B", arrive=-30_000.0, queue=0.0, input_tokens=b_resident_tokens,
                decode=60_000.0)
    f.request("r", start=-30_010.0, ttft=b_resident_tokens + 20.0, input_tokens=b_resident_tokens,
              replica="B", replica_ttft=float(b_resident_tokens), actual=0)
    f.served("p0", "B", arrive=-10_000.0, queue=0.0, input_tokens=1000)
    f.decision("p0", at_ms=-10_000.0, chosen="B", policy="round_robin", reason="round_robin",
               candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 1)}])
    f.prefixes.append(("p0", ["h1", "h2"]))
    if churn_tokens:
        f.served("c0", "B", arrive=-5_000.0, queue=0.0, input_tokens=churn_tokens)
        f.decision("c0", at_ms=-5_000.0, chosen="B", policy="round_robin", reason="round_robin",
                   candidates=[{"replica": "A", **seen(0, 0)}, {"replica": "B", **seen(0, 1)}])
        f.prefixes.append(("c0", ["z1", "z2"]))
    f.prefixes.append(("S", ["h1", "h2", "h3", "h4"]))
    f.decision("S", at_ms=0.0, chosen="A", policy="round_robin", reason="round_robin",
               candidates=[
                   {"replica": "A", "predicted_cached_tokens": 0, **seen(0, 0, kv_usage=0.1)},
                   {"replica": "B", "predicted_cached_tokens": 0,
                    **seen(0, 1, kv_usage=b_kv_usage)},
               ])
    f.served("S", "A", arrive=5.0, queue=0.0, input_tokens=2000, cached=0)
    return f


def _b(f: Fleet) -> dict[str, object]:
    (b,) = rows(f.store(), "select cached_assumed_tokens, cache_source, prefix_held_blocks "
                           "from int_attr_candidates_estimated "
                           "where request_key = 'k-S' and replica = 'B'")
    return b


def test_a_pressured_alternative_predicted_cold_is_seen_from_its_history() -> None:
    """B at KV usage 0.9 with 9000 tokens resident has room for about 1000 more; nothing was
    allocated there since p0, so p0's blocks are held (1000 of S's tokens), whatever the
    router predicted."""
    f = pressured_fleet(b_kv_usage=0.9, b_resident_tokens=9000)
    assert _b(f) == {"cached_assumed_tokens": 1000, "cache_source": "prefix_history",
                     "prefix_held_blocks": 2}
    p = primary(f.store(), "S")
    assert (p["cause"], p["sub_kind"]) == ("misrouting", "cache_blind")
    assert p["excess_ms"] == pytest.approx(1000.0, abs=1.0)


def test_a_pressured_alternative_that_turned_its_pool_over_is_cold() -> None:
    """The same B, but a 3000-token prompt was prefilled there after p0: more than the room
    its nearly full pool had, so p0's blocks count as evicted."""
    b = _b(pressured_fleet(b_kv_usage=0.9, b_resident_tokens=9000, churn_tokens=3000))
    assert b["cached_assumed_tokens"] == 0 and b["prefix_held_blocks"] == 0
