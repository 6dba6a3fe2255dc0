"""Named scenarios: a baseline plus faults that can be injected alone or together
(``"stale_telemetry+herding"``)."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._config import FleetConfig, RouterConfig
from ._errors import UnknownNameError
from ._requests import Request
from ._sim import RunSummary, Simulation
from .emit import SpanEmitter
from .workloads import make_workload, with_bursts

__all__ = ["SCENARIOS", "Scenario", "prepare_scenario", "run_scenario"]

FleetFn = Callable[[FleetConfig], FleetConfig]
WorkloadFn = Callable[[list[Request], random.Random, FleetConfig], list[Request]]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named fault: a change to the fleet configuration and/or to the workload."""

    name: str
    description: str
    fleet: FleetFn | None = None
    workload: WorkloadFn | None = None


def _router(f: FleetConfig, **kw: object) -> FleetConfig:
    return dataclasses.replace(f, router=dataclasses.replace(f.router, **kw))  # type: ignore[arg-type]


def _replica(f: FleetConfig, **kw: object) -> FleetConfig:
    return dataclasses.replace(f, replica=dataclasses.replace(f.replica, **kw))  # type: ignore[arg-type]


def _slow(f: FleetConfig) -> FleetConfig:
    over = dict(f.replica_overrides)
    over[0] = {**over.get(0, {}), "speed": 0.4}
    return dataclasses.replace(f, replica_overrides=over)


def _bursts(reqs: list[Request], rng: random.Random, f: FleetConfig) -> list[Request]:
    return with_bursts(reqs, rng, n_bursts=3, burst_size=12 * f.n_replicas, burst_span_s=2.0)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("baseline", "qp_cost router, fresh telemetry (0.25 s) with pending correction"),
        Scenario("stale_telemetry", "telemetry polled every 5 s instead of 0.25 s",
                 fleet=lambda f: _router(f, telemetry_interval_s=5.0)),
        Scenario("herding", "4 independent routers, 1 s polling, no pending correction",
                 fleet=lambda f: _router(f, n_routers=4, pending_correction=False, telemetry_interval_s=1.0)),
        Scenario("eviction_pressure", "KV pool of 150k tokens per replica instead of 440k",
                 fleet=lambda f: _replica(f, kv_capacity_tokens=150_000)),
        Scenario("load_blind_cache", "cache_aware with huge balance thresholds: prefix match only",
                 fleet=lambda f: _router(f, policy="cache_aware", balance_abs_threshold=10**9,
                                         balance_rel_threshold=1e9)),
        Scenario("slow_replica", "replica-0 runs at 0.4x speed", fleet=_slow),
        Scenario("overload_bursts", "3 bursts of 12 long requests per replica within 2 s",
                 workload=_bursts),
        Scenario("draining_polls", "least_load router polling every 3 s through bursts: queues "
                 "build and drain between two samples", fleet=lambda f: _router(
                     f, policy="least_load", telemetry_interval_s=3.0), workload=_bursts),
        Scenario("no_pending_correction", "one qp_cost router, 1 s polling, without pending "
                 "correction: its own assignments since the sample are unseen",
                 fleet=lambda f: _router(f, pending_correction=False, telemetry_interval_s=1.0)),
        Scenario("partial_prefix_index", "cache_aware router whose prefix index keeps only 20k "
                 "tokens per replica, on a 150k-token KV pool: it forgets prefixes replicas "
                 "hold and remembers some they evicted",
                 fleet=lambda f: _replica(_router(f, policy="cache_aware", tree_max_tokens=20_000),
                                          kv_capacity_tokens=150_000)),
        Scenario("last_replica_prefix_index", "cache_aware router whose prefix index remembers "
                 "only the last replica that received each prefix, on a 150k-token KV pool: it "
                 "predicts cold where an earlier replica still holds the prefix and hot where "
                 "the last one evicted it",
                 fleet=lambda f: _replica(_router(f, policy="cache_aware",
                                                  prefix_index="last_replica"),
                                          kv_capacity_tokens=150_000)),
        Scenario("ties", "least_load router on 0.25 s polling: idle replicas tie, broken by "
                 "replica order", fleet=lambda f: _router(f, policy="least_load")),
        Scenario("mixed", "the demo: 2 s telemetry polling, a smaller KV pool (200k tokens) and "
                 "replica-0 at 0.4x speed, together",
                 fleet=lambda f: _slow(_replica(_router(f, telemetry_interval_s=2.0),
                                                kv_capacity_tokens=200_000))),
    )
}
"""Scenario name -> :class:`Scenario`; combine with ``+``."""


def _resolve(name: str) -> list[Scenario]:
    parts = [p.strip() for p in name.split("+") if p.strip()]
    if not parts:
        raise UnknownNameError(f"empty scenario name; known: {sorted(SCENARIOS)}")
    out = []
    for p in parts:
        if p not in SCENARIOS:
            raise UnknownNameError(f"unknown scenario {p!r}; known: {sorted(SCENARIOS)}")
        out.append(SCENARIOS[p])
    return out


def prepare_scenario(
    name: str,
    *,
    seed: int = 0,
    n_requests: int | None = None,
    replicas: int = 8,
    emitter: SpanEmitter | None = None,
    progress: bool = False,
    policy: str | None = None,
    workload: str | Sequence[Request] = "mooncake",
    fleet: FleetConfig | None = None,
    record_log: bool = False,
) -> Simulation:
    """Build (without running) the simulation of a scenario. ``policy`` overrides the router
    policy after the scenario's own changes; ``fleet`` replaces the default base config."""
    parts = _resolve(name)
    rng = random.Random(seed)
    cfg = fleet or FleetConfig(n_replicas=replicas, router=RouterConfig(policy="qp_cost"))
    for s in parts:
        if s.fleet is not None:
            cfg = s.fleet(cfg)
    if policy is not None:
        cfg = _router(cfg, policy=policy)
    cfg.validate()
    workload_rng = random.Random(rng.getrandbits(64))
    reqs = (make_workload(workload, n_requests=n_requests, rng=workload_rng) if isinstance(workload, str)
            else list(workload)[:n_requests])
    wl_rng = random.Random(rng.getrandbits(64))
    for s in parts:
        if s.workload is not None:
            reqs = s.workload(reqs, wl_rng, cfg)
    return Simulation(reqs, cfg, seed=seed, scenario=name, emitter=emitter, record_log=record_log,
                      progress=progress)


def run_scenario(
    name: str,
    *,
    seed: int = 0,
    n_requests: int | None = None,
    replicas: int = 8,
    emitter: SpanEmitter | None = None,
    ground_truth_path: str | None = None,
    progress: bool = True,
    policy: str | None = None,
    workload: str | Sequence[Request] = "mooncake",
    fleet: FleetConfig | None = None,
) -> RunSummary:
    """Run a scenario in virtual time; write ground truth if a path is given (``.jsonl`` or
    ``.parquet``); close the emitter at the end."""
    sim = prepare_scenario(name, seed=seed, n_requests=n_requests, replicas=replicas,
                           emitter=emitter, progress=progress, policy=policy, workload=workload,
                           fleet=fleet)
    t = time.perf_counter()
    try:
        sim.run()
    finally:
        if emitter is not None:
            emitter.close()
    wall = time.perf_counter() - t
    if ground_truth_path is not None:
        sim.write_ground_truth(ground_truth_path)
    return sim.summary(wall, ground_truth_path)
