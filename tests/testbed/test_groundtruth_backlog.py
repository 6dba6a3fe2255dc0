"""The ground truth's queue estimate reads the true backlog (docs/testbed.md, "Labelling
rules"): each queued prompt without the prefix it finds cached at its admission, not the
telemetry gauge that counts it whole."""

from __future__ import annotations

import math

import testbed


def test_queue_estimate_and_overload_read_the_backlog_net_of_shared_prefixes() -> None:
    sim = testbed.prepare_scenario("overload_bursts", n_requests=240, replicas=4, progress=False)
    sim.run()
    cost = sim.cfg.cost
    rows = sim.ground_truth_rows()
    shared = 0
    for row in rows:
        queues = []
        for s in row["true_state"]:
            backlog = s["backlog_prefill_tokens"]
            assert 0 <= backlog <= s["remaining_prefill_tokens"]
            shared += backlog < s["remaining_prefill_tokens"]
            q, _ = cost.estimate_ms(
                backlog_prefill_tokens=backlog, n_running=s["running"], uncached_tokens=1,
                cached_tokens=0, max_batched_tokens=sim.cfg.replica.max_batched_tokens,
                speed=s["speed"])
            assert math.isclose(s["est_queue_ms"], q, rel_tol=1e-9, abs_tol=1e-9)
            queues.append(q)
        if row["outcome"] == "routed" and row["slow"]:
            assert math.isclose(row["cause_ms_overload"], min(queues), rel_tol=1e-9,
                                abs_tol=1e-9)
    # the bursts queue prompts of one prefix behind each other: the gauge overstates the work
    assert shared > 0
