from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

import testbed
from testbed import FleetConfig, RouterConfig, prepare_scenario
from testbed.emit import RecordingEmitter, SpanEmitter

N = 800  # first 800 Mooncake requests (~4 min of traffic) on 8 replicas


def _run(name: str, **kw: object) -> testbed.Simulation:
    sim = prepare_scenario(name, n_requests=kw.pop("n", N), **kw)  # type: ignore[arg-type]
    sim.run()
    return sim


@pytest.fixture(scope="module")
def ground_truth() -> dict[str, list[dict]]:
    return {name: _run(name).ground_truth_rows() for name in testbed.SCENARIOS}


def _count(rows: list[dict], cause: str) -> int:
    return sum(cause in r["causes"] for r in rows)


def test_exact_event_log_for_a_seed() -> None:
    a = _run("herding", n=150, seed=3, record_log=True, policy="power_of_two")
    b = _run("herding", n=150, seed=3, record_log=True, policy="power_of_two")
    c = _run("herding", n=150, seed=4, record_log=True, policy="power_of_two")
    assert a.log and a.log == b.log
    assert a.log != c.log
    assert a.ground_truth_rows() == b.ground_truth_rows()


def test_small_run_golden_prefix() -> None:
    sim = _run("baseline", n=4, record_log=True, replicas=2)
    routes = [e for e in sim.log if e[0] == "route"]  # type: ignore[union-attr]
    assert [(e[1], e[4]) for e in routes] == [("mc-0", 0.0), ("mc-1", 0.0), ("mc-2", 0.0), ("mc-3", 0.0)]
    assert {e[3] for e in routes} == {"replica-0", "replica-1"}  # qp_cost spreads an idle fleet
    fins = [e for e in sim.log if e[0] == "finish"]  # type: ignore[union-attr]
    assert len(fins) == 4 and all(e[2] in ("stop", "length") for e in fins)


@pytest.mark.parametrize(
    ("scenario", "cause"),
    [
        ("stale_telemetry", "stale_telemetry"),
        ("herding", "stale_telemetry"),
        ("eviction_pressure", "eviction"),
        ("load_blind_cache", "misrouting"),
        ("slow_replica", "slow_replica"),
        ("overload_bursts", "overload"),
    ],
)
def test_fault_changes_ground_truth(ground_truth: dict[str, list[dict]], scenario: str, cause: str) -> None:
    base = _count(ground_truth["baseline"], cause)
    fault = _count(ground_truth[scenario], cause)
    assert fault >= max(1.5 * base, base + 10), (scenario, cause, base, fault)


def test_herding_subcause(ground_truth: dict[str, list[dict]]) -> None:
    sub = collections.Counter(r["stale_subcause"] for r in ground_truth["herding"])
    assert sub["herding"] > 100
    assert sub["herding"] == max(v for k, v in sub.items() if k)


def test_ground_truth_rows_are_consistent(ground_truth: dict[str, list[dict]]) -> None:
    for rows in ground_truth.values():
        for r in rows:
            assert r["primary_cause"] in r["causes"] or r["causes"] == ["none"]
            if not r["slow"]:
                assert r["causes"] == ["none"]
            assert len(r["true_state"]) == len(r["seen_state"]) == 8
            if r["actual_cached_tokens"] is not None:
                assert r["actual_cached_tokens"] < r["input_tokens"]


def test_combined_scenarios_and_unknown_names() -> None:
    sim = prepare_scenario("stale_telemetry+slow_replica", n_requests=10)
    assert sim.cfg.router.telemetry_interval_s == 5.0 and sim.cfg.replica_config(0).speed == 0.4
    with pytest.raises(testbed.UnknownNameError, match="known"):
        prepare_scenario("nope")
    with pytest.raises(testbed.ConfigError):
        FleetConfig(router=RouterConfig(policy="nope")).validate()


def test_run_scenario_writes_ground_truth_and_emits(tmp_path: Path) -> None:
    em = RecordingEmitter()
    assert isinstance(em, SpanEmitter)
    out = tmp_path / "gt.jsonl"
    s = testbed.run_scenario("baseline", n_requests=60, emitter=em, ground_truth_path=str(out), progress=False)
    assert s.n_requests == 60 and s.n_finished == 60 and em.closed
    lines = out.read_text().splitlines()
    assert len(lines) == 60
    row = json.loads(lines[0])
    for col in ("request_id", "true_state", "seen_state", "changes_on_true_load", "cache_outcome",
                "best_alternative", "best_alternative_est_ttft_ms", "actual_ttft_ms", "causes",
                "primary_cause"):
        assert col in row
    assert len(em.traces) == 60
    t = em.traces[0]
    assert t.send_ns <= t.decided_ns <= t.first_token_ns <= t.end_ns  # type: ignore[operator]
    assert len(t.candidates) == 8 and t.chosen == t.replica
    pq = tmp_path / "gt.parquet"
    testbed.run_scenario("baseline", n_requests=20, ground_truth_path=str(pq), progress=False)
    import pyarrow.parquet as papq

    assert papq.read_table(pq).num_rows == 20


def test_admission_limit_rejects() -> None:
    fleet = FleetConfig(n_replicas=2, router=RouterConfig(policy="least_load", admission_limit=1,
                                                          telemetry_interval_s=0.25))
    sim = prepare_scenario("overload_bursts", n_requests=50, fleet=fleet)
    sim.run()
    rows = sim.ground_truth_rows()
    rej = [r for r in rows if r["outcome"] == "rejected"]
    assert rej and all(r["primary_cause"] == "overload" for r in rej)


def test_public_surface() -> None:
    names = {n for n in dir(testbed) if not n.startswith("_")}
    modules = {"emit", "policies", "workloads", "live"}
    assert set(testbed.__all__) == names - modules


@pytest.mark.parametrize("policy", sorted(testbed.POLICIES))
@pytest.mark.parametrize("workload", ["mooncake", "short_long_mix", "hot_prefix", "aibrix", "azure_code"])
def test_every_policy_runs_every_workload(policy: str, workload: str) -> None:
    sim = prepare_scenario("baseline", n_requests=60, replicas=3, policy=policy, workload=workload)
    sim.run()
    s = sim.summary(0.0)
    assert s.n_finished + s.n_aborted + s.n_rejected == 60
    for r in sim.replicas:
        r.pool.check()
        assert r.pool.free + r.pool.evictable == r.pool.capacity  # every block returned


def test_labels_are_counterfactual_savings(ground_truth: dict[str, list[dict]]) -> None:
    """long_prompt is the ideal TTFT's part above the SLO; a predicted-but-missing prefix is
    eviction whether it went after the decision or was never there (sub-cause)."""
    slo = testbed.LabelConfig().ttft_slo_ms
    seen_never = 0
    for rows in ground_truth.values():
        for r in rows:
            lp = r["cause_ms_long_prompt"]
            if r["outcome"] == "routed":
                if r["ideal_ttft_ms"] > slo:
                    assert lp == pytest.approx(r["ideal_ttft_ms"] - slo)
                else:
                    assert lp == 0.0
            if "eviction" in r["causes"]:
                assert r["lost_cached_tokens"] >= 16
                want = ("evicted_after_decision" if r["cache_outcome"] == "evicted_before_prefill"
                        else "never_cached")
                assert r["eviction_subcause"] == want
                seen_never += want == "never_cached"
            else:
                assert r["eviction_subcause"] is None
    assert seen_never > 0
