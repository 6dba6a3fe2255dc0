"""Seeded runs give exactly the outcomes recorded in ``data/engine_reference.json``: per request
the decision (router, candidates as seen, scores, prediction), the replica's timings, cached and
generated tokens, the traces handed to the emitter, the ground-truth rows (with ground truth)
and the summary. Floats are compared by ``repr``, so a change of the simulator's engine that
moves any figure by one ulp fails here.

Regenerate (only when a change of the *model* is intended):
``PYTHONPATH=. python tests/testbed/test_engine_reference.py --write``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import testbed
from testbed import FleetConfig, RouterConfig
from testbed.emit import RecordingEmitter

REFERENCE = Path(__file__).resolve().parent / "data" / "engine_reference.json"

# (case name, scenario, workload, policy, n requests, replicas, ground truth, fleet changes)
CASES: list[tuple[str, str, str, str | None, int, int, bool, dict[str, Any]]] = [
    ("baseline-mooncake-gt", "baseline", "mooncake", None, 600, 8, True, {}),
    ("baseline-mooncake-nogt", "baseline", "mooncake", None, 600, 8, False, {}),
    ("herding-mooncake-gt", "herding", "mooncake", None, 500, 8, True, {}),
    ("evict-cache_aware-nogt", "stale_telemetry+eviction_pressure", "mooncake", "cache_aware",
     500, 4, False, {}),
    ("load_blind-azure_code-gt", "load_blind_cache", "azure_code", None, 400, 4, True, {}),
    ("partial_index-aibrix-nogt", "partial_prefix_index", "aibrix", None, 400, 4, False, {}),
    ("bursts-p2-timeout-gt", "overload_bursts", "short_long_mix", "power_of_two", 400, 4, True,
     {"client_timeout_s": 3.0}),
    ("mixed-random-admission-nogt", "mixed", "bursts", "random", 400, 4, False,
     {"admission_limit": 2}),
    ("mixed-azure_conv-gt", "mixed", "azure_conv", None, 400, 4, True, {}),
    ("draining-hot_prefix-gt", "draining_polls", "hot_prefix", None, 400, 4, True, {}),
    ("slow-rr-bursts-gt", "slow_replica", "bursts", "round_robin", 400, 4, True, {}),
    ("ties-uniform-timeout-nogt", "ties", "uniform_short", None, 400, 4, False,
     {"client_timeout_s": 1.0}),
]


def _fleet(replicas: int, changes: dict[str, Any]) -> FleetConfig | None:
    if not changes:
        return None
    router = {k: v for k, v in changes.items() if k in {f.name for f in dataclasses.fields(RouterConfig)}}
    fleet = {k: v for k, v in changes.items() if k not in router}
    return FleetConfig(n_replicas=replicas, router=RouterConfig(policy="qp_cost", **router), **fleet)


def _views(views: Any) -> list[tuple[Any, ...]]:
    return [tuple(repr(x) for x in _plain(v)) for v in views]


def _plain(x: Any) -> Any:
    """``x`` as plain tuples, lists and dicts (what ``dataclasses.astuple`` gives for
    dataclasses, for named tuples too): the values, whatever the record types."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return tuple(_plain(getattr(x, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def outcomes(case: tuple[str, str, str, str | None, int, int, bool, dict[str, Any]]) -> dict[str, Any]:
    """Every outcome of one case, as sha256 digests of its parts."""
    _, scenario, workload, policy, n, replicas, gt, changes = case
    em = RecordingEmitter()
    sim = testbed.prepare_scenario(scenario, n_requests=n, replicas=replicas, seed=11, policy=policy,
                                   workload=workload, emitter=em, fleet=_fleet(replicas, changes))
    sim.ground_truth = gt
    sim.run()
    per_request = []
    for rec in sim.records:
        ch = rec.choice
        seq = rec.seq
        per_request.append([
            rec.req.request_id, rec.router, repr(rec.t_decide), rec.predicted,
            None if ch is None else [ch.index, ch.reason, [repr(s) for s in ch.scores]],
            _views(rec.seen), rec.unseen_own, rec.unseen_other, repr(rec.speed),
            None if seq is None else [repr(x) for x in (
                seq.t_arrival, seq.t_admit, seq.t_first_token, seq.t_finish, seq.cached_first,
                seq.generated, seq.preemptions, seq.finish_reason)],
        ])
    traces = [repr(_plain(t)) for t in em.traces]
    summary = dataclasses.asdict(sim.summary(0.0))
    for k in ("wall_s", "events"):  # wall clock; count of internal events (not an outcome)
        summary.pop(k)
    replicas_state = [[r.steps, repr(r.busy_s), r.preemptions, r.pool.evictions,
                       r.pool.evicted_blocks] for r in sim.replicas]
    parts: dict[str, Any] = {"requests": per_request, "traces": traces,
                             "summary": json.loads(json.dumps(summary, default=repr)),
                             "replicas": replicas_state}
    if gt:
        parts["ground_truth"] = json.loads(json.dumps(sim.ground_truth_rows(), default=repr))
    out: dict[str, Any] = {"n": len(sim.records)}
    for k, v in parts.items():
        blob = json.dumps(v, sort_keys=True, default=repr).encode()
        out[k] = hashlib.sha256(blob).hexdigest()
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_seeded_run_matches_recorded_outcomes(case: tuple[Any, ...]) -> None:
    want = json.loads(REFERENCE.read_text())[case[0]]
    got = outcomes(case)
    assert got == want


if __name__ == "__main__" and "--write" in sys.argv:
    REFERENCE.write_text(json.dumps({c[0]: outcomes(c) for c in CASES}, indent=1, sort_keys=True) + "\n")
