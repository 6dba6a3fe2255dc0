"""Measured routing savings in the ground truth (``LabelConfig.measured_routing``,
docs/testbed.md, "Labelling rules").

Where the cost model's estimate decides the label (a slow request on a slow replica, or on a
replica under memory pressure whose TTFT the model misses, or a routing saving resting on a
replica under memory pressure), the ground truth measures the request's TTFT on every other
replica by re-running the simulation with it forced there, stopped at its first token, and
sizes the routing savings and overload from those. These tests check that TTFT against full
re-runs forced by a policy wrapper of their own (not the simulation's ``forced`` option), that
the routing savings follow the documented rule on those measured TTFTs (slowness first on a
slow replica: from its TTFT at the fleet's speed), that they then differ from the modelled ones
where the two disagree, and that nothing changes without the option (no extra fields, same
rows).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import testbed
from testbed._groundtruth import CAUSES
from testbed.policies import Choice

# (scenario, requests, replicas): small runs with slow requests on the slow replica whose
# modelled and measured routing savings differ, and one with replicas under memory pressure
CASES = [("slow_replica", 60, 4), ("mixed", 80, 4), ("eviction_pressure", 320, 8)]


def row_bar(row: dict[str, Any], lc: testbed.LabelConfig) -> float:
    """The cause bar of a ground-truth row (its TTFT, or its lifetime without a first token)."""
    ttft = row["actual_ttft_ms"]
    return max(lc.min_cause_ms, lc.min_cause_frac * ttft) if ttft is not None else lc.min_cause_ms


class _ForceOne:
    """The router's policy, except that one request goes to ``replica``."""

    def __init__(self, policy: Any, request_id: str, replica: int) -> None:
        self._policy = policy
        self._request_id = request_id
        self._replica = replica

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    def decide(self, rv: Any, views: Any, rng: Any) -> Any:
        choice = self._policy.decide(rv, views, rng)
        if rv.request_id == self._request_id:
            return Choice(self._replica, "forced", choice.scores)
        return choice


def _sim(scenario: str, n: int, replicas: int, measured: bool) -> testbed.Simulation:
    sim = testbed.prepare_scenario(scenario, n_requests=n, replicas=replicas, progress=False)
    sim.cfg = dataclasses.replace(
        sim.cfg, labels=dataclasses.replace(sim.cfg.labels, measured_routing=measured))
    return sim


def _full_forced_ttft(scenario: str, n: int, replicas: int, request_id: str,
                      replica: int) -> float | None:
    sim = _sim(scenario, n, replicas, measured=False)
    sim.ground_truth = False
    for rt in sim.routers:
        rt.policy = _ForceOne(rt.policy, request_id, replica)
    sim.run()
    rec = next(r for r in sim.records if r.req.request_id == request_id)
    assert rec.choice is not None and rec.choice.index == replica
    if rec.seq is None or rec.seq.t_first_token is None:
        return None
    return (rec.seq.t_first_token - rec.req.arrival_s) * 1000.0


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def runs(request: pytest.FixtureRequest) -> tuple[tuple[str, int, int], list[dict], list[dict]]:
    scenario, n, replicas = request.param
    modelled = _sim(scenario, n, replicas, measured=False)
    modelled.run()
    measured = _sim(scenario, n, replicas, measured=True)
    measured.run()
    return request.param, modelled.ground_truth_rows(), measured.ground_truth_rows()


def test_off_by_default_rows_unchanged() -> None:
    assert testbed.LabelConfig().measured_routing is False
    sim = testbed.prepare_scenario("slow_replica", n_requests=30, replicas=4, progress=False)
    sim.run()
    assert all("routing_measured" not in r and "measured_ttft_ms" not in r
               for r in sim.ground_truth_rows())


def test_measured_ttft_is_a_full_forced_run(runs: Any) -> None:
    (scenario, n, replicas), _, rows = runs
    measured = [r for r in rows if r["routing_measured"]]
    assert measured
    for row in measured[:4]:
        request_id = row["request_id"].split(":")[-1]
        chosen = int(row["chosen"].rsplit("-", 1)[1])
        # the chosen replica again: the run is the original one
        assert _full_forced_ttft(scenario, n, replicas, request_id, chosen) == \
            row["actual_ttft_ms"]
        for rid, ttft in row["measured_ttft_ms"].items():
            i = int(rid.rsplit("-", 1)[1])
            assert i != chosen
            assert _full_forced_ttft(scenario, n, replicas, request_id, i) == ttft


def test_routing_savings_follow_the_measured_ttfts(runs: Any) -> None:
    (scenario, _, _), modelled, rows = runs
    lc = testbed.LabelConfig()
    changed = memory_measured = modelled_on_free = pressed_rest_measured = exact_overload = 0
    for old, row in zip(modelled, rows, strict=True):
        on_slow = row["slow"] and row["chosen_speed"] is not None \
            and row["chosen_speed"] < lc.slow_replica_speed and row["actual_ttft_ms"] is not None
        if on_slow:
            assert row["routing_measured"]
        memory_missed = False
        if row["slow"] and row["actual_ttft_ms"] is not None:
            # under memory pressure on the chosen replica the cost model missed the TTFT there
            # by the bar: measured
            missed = abs(row["actual_ttft_ms"] - row["cause_ms_eviction"]
                         - row["chosen_est_ttft_ms"])
            bar = max(lc.min_cause_ms, lc.min_cause_frac * row["actual_ttft_ms"])
            kv = {s["replica"]: s["kv_usage"] for s in row["true_state"]}[row["chosen"]]
            if missed >= bar and (row["preemptions"] > 0 or kv >= lc.kv_pressure):
                assert row["routing_measured"]
                memory_measured += 1
                memory_missed = True
        modelled_saving = max(old["cause_ms_misrouting"], old["cause_ms_stale_telemetry"])
        if row["routing_measured"] and not (on_slow or memory_missed
                                            or modelled_saving > row["actual_ttft_ms"]):
            # measured for no reason but a modelled saving that counts while the best replica
            # or the policy's true-load choice was under memory pressure
            kv = {s["replica"]: s["kv_usage"] for s in row["true_state"]}
            rested_on = [old["best_alternative"], old["decision_on_true_load"]]
            assert modelled_saving >= row_bar(row, lc)
            assert any(kv[r] >= lc.kv_pressure for r in rested_on if r is not None)
            pressed_rest_measured += 1
        if not row["routing_measured"]:
            assert row["measured_ttft_ms"] is None
            # a modelled routing saving that counts never rests on a replica under memory
            # pressure (its queue may be held up by memory, which the model does not see)
            if row["slow"] and max(row["cause_ms_misrouting"],
                                   row["cause_ms_stale_telemetry"]) >= row_bar(row, lc):
                kv = {s["replica"]: s["kv_usage"] for s in row["true_state"]}
                rested_on = [row["best_alternative"], row["decision_on_true_load"]]
                assert all(kv[r] < lc.kv_pressure for r in rested_on if r is not None)
                modelled_on_free += 1
            assert {k: v for k, v in row.items()
                    if k not in ("routing_measured", "measured_ttft_ms")} == old
            continue
        actual = row["actual_ttft_ms"]
        bar = max(lc.min_cause_ms, lc.min_cause_frac * actual)
        # slowness first: on a slow replica, from the chosen replica's TTFT at the fleet's speed
        nominal = row["chosen_speed"] if row["chosen_speed"] < lc.slow_replica_speed else 1.0
        ttft = {k: v for k, v in row["measured_ttft_ms"].items() if v is not None}
        ttft[row["chosen"]] = actual * nominal
        routed = (actual - row["cause_ms_eviction"]) * nominal
        best = min(ttft.values())
        d = row["decision_on_true_load"]
        stale = routed - ttft[d] if d is not None and d != row["chosen"] and d in ttft else 0.0
        if stale >= bar:
            assert row["cause_ms_stale_telemetry"] == stale
            assert row["cause_ms_misrouting"] == max(0.0, ttft[d] - best)
        else:
            assert row["cause_ms_stale_telemetry"] == 0.0
            assert row["cause_ms_misrouting"] == max(0.0, routed - best)
        # overload: the least measured wait, a TTFT less the prompt's prefill on that
        # replica's true cache (the chosen replica's own wait is one of them)
        prefill = {s["replica"]: s["est_prefill_ms"] for s in row["true_state"]}
        waits = [max(0.0, t - prefill[r]) for r, t in row["measured_ttft_ms"].items()
                 if t is not None]
        assert 0.0 <= row["cause_ms_overload"] <= min(waits, default=float("inf")) + 1e-6
        chosen_wait = max(0.0, actual - row["cause_ms_eviction"] - prefill[row["chosen"]])
        if row["predicted_cached_tokens"] <= row["cached_at_decision_tokens"]:
            # routed on the cache the replica held: the prompt's prefill is its estimate there
            assert row["cause_ms_overload"] == pytest.approx(min([*waits, chosen_wait]))
            exact_overload += 1
        # the other causes are sized as without the option
        for cause in ("eviction", "slow_replica", "long_prompt"):
            assert row[f"cause_ms_{cause}"] == old[f"cause_ms_{cause}"]
        savings = {c: row[f"cause_ms_{c}"] or 0.0 for c in CAUSES}
        kept = [c for c in CAUSES if savings[c] >= bar]
        want = max(kept, key=lambda c: (savings[c], -CAUSES.index(c))) \
            if kept else "none"
        assert row["primary_cause"] == want
        changed += any(row[f"cause_ms_{c}"] != old[f"cause_ms_{c}"]
                       for c in ("misrouting", "stale_telemetry"))
    # the small runs hold requests where the modelled and the measured savings disagree
    assert changed >= 1
    assert exact_overload >= 1
    if scenario == "eviction_pressure":
        # and requests measured for memory pressure on the chosen replica or on the replicas
        # a modelled saving rests on, and modelled savings that count resting on replicas
        # free of it
        assert memory_measured >= 1
        assert pressed_rest_measured >= 1
        assert modelled_on_free >= 1


def test_slowness_first_on_a_slow_replica(runs: Any) -> None:
    """On a slow replica the routing causes have only what an alternative saves beyond the
    replica's slowness: where stale_telemetry does not count, slow_replica and misrouting split
    the measured saving of a move to the best replica (TTFT less the eviction, less the best
    measured TTFT), slowness first."""
    _, _, rows = runs
    lc = testbed.LabelConfig()
    split = 0
    for row in rows:
        if not (row["routing_measured"] and row["chosen_speed"] < lc.slow_replica_speed):
            continue
        actual = row["actual_ttft_ms"]
        speed = row["chosen_speed"]
        ev = row["cause_ms_eviction"]
        assert row["cause_ms_slow_replica"] == pytest.approx(actual * (1.0 - speed))
        best = min(v for v in row["measured_ttft_ms"].values() if v is not None)
        # routing never gets more than the chosen replica at the fleet's speed would have saved
        assert row["cause_ms_misrouting"] + row["cause_ms_stale_telemetry"] \
            <= max(0.0, (actual - ev) * speed - min(best, actual * speed)) + 1e-6
        if row["cause_ms_stale_telemetry"] == 0.0 and row["cause_ms_misrouting"] > 0.0:
            moved = actual - ev - best
            assert (actual - ev) * (1.0 - speed) + row["cause_ms_misrouting"] \
                == pytest.approx(moved)
            split += 1
    # every run with a slow replica holds such a split
    assert split >= 1 or all(row["chosen_speed"] is None
                             or row["chosen_speed"] >= lc.slow_replica_speed for row in rows)


def test_slowness_first_in_the_modelled_labels() -> None:
    """Without measured routing the same rule holds on the cost model's estimates: misrouting
    on a slow replica is the chosen replica's estimate at the fleet's speed (speed x E'(c))
    less the best estimate."""
    sim = _sim("slow_replica", 60, 4, measured=False)
    sim.run()
    lc = sim.cfg.labels
    seen = 0
    for row in sim.ground_truth_rows():
        if not (row["slow"] and row["chosen_speed"] is not None
                and row["chosen_speed"] < lc.slow_replica_speed
                and row["cause_ms_stale_telemetry"] == 0.0):
            continue
        best = min(s["est_ttft_ms"] for s in row["true_state"])
        want = max(0.0, row["chosen_est_ttft_ms"] * row["chosen_speed"] - best)
        assert row["cause_ms_misrouting"] == pytest.approx(want)
        seen += want > 0.0
    assert seen >= 1
