"""An alternative's prefix history is kept per class of blocks with one service history (the
same executions served them): a block is looked up in its class's history, so the classes must
never join blocks served by different executions, however alike their counts. Hand-built marts
as in test_attribution_prefix_release."""

from __future__ import annotations

from test_attribution import rows
from test_attribution_prefix_release import TWO_PROMPTS, b_cached, released_fleet


def test_blocks_served_as_often_keep_their_own_history() -> None:
    """S's second block h2 was served twice (p0 on B, S itself on A), like h0q (q on B, z on
    C0). p0 ended long before S's decision and B released 40,000 tokens since into a
    20,000-token pool: B no longer held h1 h2. q still runs on B at the decision, its blocks
    referenced; read as h2's history it would make B hold S's prefix."""
    f = released_fleet(b_later=TWO_PROMPTS, others=((10_000, 0.5),))
    f.execution("q", "B", arrive=-20_000.0, queue=0.0, input_tokens=1000, decode=60_000.0)
    f.request("q", start=-20_010.0, ttft=1020.0, input_tokens=1000, replica="B",
              replica_ttft=1000.0, actual=0)
    f.decision("q", at_ms=-20_000.0, chosen="B", policy="round_robin", reason="round_robin")
    f.prefixes.append(("q", ["h9", "h0q"]))
    f.served("z", "C0", arrive=-10_000.0, queue=0.0, input_tokens=500)
    f.decision("z", at_ms=-10_000.0, chosen="C0", policy="round_robin", reason="round_robin")
    f.prefixes.append(("z", ["h0q"]))
    assert b_cached(f) == 0


def test_blocks_always_served_together_are_one_lookup() -> None:
    """h1 and h2 were only ever served together (p0 on B, S on A): one class, and B's history
    of it gives both blocks (1000 tokens) while p0 still runs at S's decision."""
    f = released_fleet(p0_decode=120_000.0, b_later=TWO_PROMPTS, others=((10_000, 0.5),))
    assert b_cached(f) == 1000
    (s,) = rows(f.store(), "select prefix_held_blocks from int_attr_candidates_state "
                           "where request_key = 'k-S' and replica = 'B'")
    assert s["prefix_held_blocks"] == 2
