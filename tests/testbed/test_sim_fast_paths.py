"""The simulator's shortcuts change nothing observable.

* ``ground_truth=False`` runs the same simulation (decisions, timings, emitted traces) as a run
  with ground truth; only the labels are missing.
* Snapshots served from the per-replica cache equal the telemetry recomputed from the queues at
  any instant, in decode runs too.
* The decision on the true state is reused from the one on the true load exactly when the
  router's cache prediction equals the true cache.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import testbed
from testbed._env import PRIO_ARRIVAL
from testbed._replica import Replica, Snapshot
from testbed._router import build_views
from testbed.emit import RecordingEmitter
from testbed.policies import make_policy


def _summary(sim: testbed.Simulation) -> dict[str, object]:
    s = dataclasses.asdict(sim.summary(0.0))
    for k in ("wall_s", "cause_counts", "primary_cause_counts"):
        s.pop(k)
    return s


@pytest.mark.parametrize(("scenario", "policy"), [("herding", None), ("mixed", "cache_aware"),
                                                  ("overload_bursts", "power_of_two")])
def test_run_without_ground_truth_is_the_same_run(scenario: str, policy: str | None) -> None:
    runs = []
    for gt in (True, False):
        em = RecordingEmitter()
        sim = testbed.prepare_scenario(scenario, n_requests=250, replicas=4, seed=5, policy=policy,
                                       emitter=em, record_log=True)
        sim.ground_truth = gt
        sim.run()
        runs.append((sim, em))
    (a, ea), (b, eb) = runs
    assert a.log == b.log and ea.traces == eb.traces and len(ea.traces) == len(a.records) >= 250
    assert _summary(a) == _summary(b)
    assert b.records[0].true_snaps == [] and b.records[0].labels == {}
    with pytest.raises(testbed.TestbedError, match="ground_truth=False"):
        b.ground_truth_rows()


def test_simulation_takes_ground_truth_flag() -> None:
    reqs = [testbed.Request(f"r{i}", i * 0.01, 600, 20, 20, (i, i + 1)) for i in range(30)]
    sim = testbed.Simulation(reqs, testbed.FleetConfig(n_replicas=2), ground_truth=False)
    sim.run()
    s = sim.summary(0.0)
    assert s.n_finished == 30 and s.cause_counts == {} and s.primary_cause_counts == {}


def _telemetry_from_queues(r: Replica) -> Snapshot:
    """Telemetry recomputed from the queues alone (no counters, no cache)."""
    now = r.env.now
    j = 0
    if r._run_k:
        j = min(r._run_k, int((now - r._step_start) / r._run_dt + 1e-9))
    dec = sum(max(0, s.exp_out - s.generated) for s in r.waiting)
    for s in r.running:
        dec += max(0, s.exp_out - s.generated - (j if s.computed >= s.target else 0))
    prefill = sum(s.target - s.computed for s in list(r.waiting) + r.running)
    pool = r.pool
    return Snapshot(r.id, now, len(r.waiting), len(r.running),
                    (pool.capacity - pool.free - pool.evictable) / pool.capacity, prefill, dec)


@pytest.mark.parametrize(("scenario", "replicas"), [("baseline", 8), ("eviction_pressure", 3),
                                                    ("overload_bursts", 4)])
def test_snapshots_equal_telemetry_recomputed_from_queues(scenario: str, replicas: int) -> None:
    sim = testbed.prepare_scenario(scenario, n_requests=300, replicas=replicas, seed=2)
    checked = {"n": 0, "in_run": 0}
    rng = random.Random(1)
    end = sim.requests[-1].arrival_s + 60.0

    def probe() -> None:
        for r in sim.replicas:
            assert r.snapshot() == _telemetry_from_queues(r)
            r.pool.check()
            checked["n"] += 1
            checked["in_run"] += bool(r._run_k) and r.env.now > r._step_start
        if sim.env.now < end:
            # irregular instants, so probes land inside decode runs, not only on step ends
            sim.env.after(rng.uniform(0.001, 0.2), PRIO_ARRIVAL, probe)

    sim.env.at(0.0, PRIO_ARRIVAL, probe)
    sim.run()
    assert checked["n"] > 1000 and checked["in_run"] >= (100 if scenario == "baseline" else 0)


def test_decision_on_true_state_is_the_policy_on_the_true_cache() -> None:
    # qp_cost draws no random numbers and keeps no state: its decisions can be re-run here
    sim = testbed.prepare_scenario("eviction_pressure", n_requests=400, replicas=4, seed=4)
    sim.run()
    cfg = sim.cfg
    policy = make_policy("qp_cost", cfg.router, cfg.cost, cfg.replica.max_batched_tokens)
    zeros = [0] * cfg.n_replicas
    differs = changed = 0
    for rec in sim.records:
        views = build_views(rec.req, rec.true_snaps, rec.t_decide, pending=zeros,
                            pending_tokens=zeros, pending_prefill=zeros, predicted=rec.true_cached,
                            cost=cfg.cost, max_batched_tokens=cfg.replica.max_batched_tokens,
                            admission_limit=cfg.router.admission_limit)
        rv = sim.routers[rec.router].request_view(rec.req)
        assert rec.d_oracle == policy.decide(rv, views, random.Random(0)).index
        differs += rec.predicted != rec.true_cached
        changed += rec.d_oracle != rec.d_true_load
    assert differs > 20 and changed > 5  # both paths ran, and the true cache mattered
