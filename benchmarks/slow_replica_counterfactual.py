"""Routing savings on a slow replica, measured instead of modelled (docs/attribution.md,
"Accuracy").

The ground truth sizes slow_replica from the measured TTFT (TTFT x (1 - speed)) and, unless
``LabelConfig.measured_routing`` is on, misrouting and stale_telemetry with its cost model on
the true state (chosen replica's estimate minus the alternative's); the audit sizes the routing
causes from the measured TTFT and its estimate of the alternative. This benchmark measures the
routing savings: for every slow request served by a replica slower than
``LabelConfig.slow_replica_speed``, it re-runs the scenario's simulation (same seed: only that
request's routing changes) with the request forced onto each replica in turn
(``Simulation.forced_ttft_ms``, each run stopped at the request's first token), and takes the
measured TTFTs as the alternatives'. The measured verdict applies the ground truth's own rules
(docs/testbed.md, "Labelling rules") to those savings, slowness first (the chosen replica's
TTFT at the fleet's speed, TTFT x speed, is where the routing savings start): stale_telemetry =
that TTFT - TTFT on the policy's true-load choice, when that differs from the chosen replica
and passes the bar, misrouting = the rest down to the best replica, slow_replica = TTFT x
(1 - speed), the other
causes as the ground truth sized them. It prints how often that verdict agrees with the ground
truth and with the audit, and the verdicts where they disagree. Against a ground truth labelled
with ``measured_routing`` (the accuracy benchmark's default) the ground truth agrees with every
measured verdict, a check of the two implementations; against one labelled with
``--modelled-routing`` it shows where the cost model decided the label.

    python3 benchmarks/attribution_accuracy.py --workdir DIR --scenarios slow_replica,mixed \
        --dump DIR/dump.parquet [--modelled-routing]
    python3 benchmarks/slow_replica_counterfactual.py --workdir DIR --dump DIR/dump.parquet

One simulation per replica per request (some 90 requests, a few minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CAUSES = ("misrouting", "eviction", "stale_telemetry", "overload", "slow_replica", "long_prompt")
"""The ground truth's causes in its tie-break order (testbed._groundtruth.CAUSES)."""


def routed_ttft_ms(scenario: str, seed: int, n_requests: int, request_id: str,
                   replica: int) -> float | None:
    """The request's TTFT (arrival -> first token) when the scenario is re-run with it routed
    to ``replica`` (None: no first token)."""
    import testbed

    sim = testbed.prepare_scenario(scenario, seed=seed, n_requests=n_requests, progress=False)
    return sim.forced_ttft_ms(request_id, replica)


def primary(savings: dict[str, float], bar_ms: float) -> str:
    kept = [k for k in CAUSES if savings[k] >= bar_ms]
    return max(kept, key=lambda k: (savings[k], -CAUSES.index(k))) if kept else "none"


def measured_verdict(row: dict[str, Any], routed: dict[str, float | None], labels: Any) -> str:
    """The ground truth's rules on the measured routing savings (module docstring)."""
    actual = float(row["actual_ttft_ms"])
    bar = max(labels.min_cause_ms, labels.min_cause_frac * actual)
    savings = {k: float(row[f"cause_ms_{k}"] or 0.0) for k in CAUSES}
    # slowness first: the routing causes have what an alternative saves beyond the replica's
    # slowness, from the chosen replica's TTFT at the fleet's speed (speed x TTFT)
    speed = float(row["chosen_speed"])
    ttfts = {r: t for r, t in routed.items() if t is not None}
    ttfts[row["chosen"]] = actual * speed
    best = min(ttfts.values())
    # the chosen replica with the cache predicted there (the eviction is its own cause)
    routed_there = (actual - savings["eviction"]) * speed
    d = row["decision_on_true_load"]
    stale = routed_there - ttfts[d] if d is not None and d != row["chosen"] and d in ttfts else 0.0
    if stale >= bar:
        savings["stale_telemetry"] = stale
        savings["misrouting"] = max(0.0, ttfts[d] - best)
    else:
        savings["stale_telemetry"] = 0.0
        savings["misrouting"] = max(0.0, routed_there - best)
    savings["slow_replica"] = actual * (1.0 - float(row["chosen_speed"]))
    return primary(savings, bar)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True,
                    help="the accuracy benchmark's --workdir (its ground truth files)")
    ap.add_argument("--dump", type=Path, required=True,
                    help="the accuracy benchmark's --dump of the same scenarios")
    ap.add_argument("--scenarios", default="slow_replica,mixed")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import testbed

    audit = {r["request_id"]: (r["audit_cause"] or "none", bool(r["gt_clear_cut"]))
             for r in pl.read_parquet(args.dump).iter_rows(named=True)}
    agree: Counter[tuple[str, str]] = Counter()
    lines: list[str] = []
    for scenario in args.scenarios.split(","):
        sim = testbed.prepare_scenario(scenario, seed=args.seed, n_requests=1, progress=False)
        labels = sim.cfg.labels
        index = {r.id: i for i, r in enumerate(sim.replicas)}
        with open(args.workdir / f"{scenario}.groundtruth.jsonl", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        for row in rows:
            if not row["slow"] or row["chosen"] is None or row["actual_ttft_ms"] is None:
                continue
            if row["chosen_speed"] >= labels.slow_replica_speed:
                continue
            wire_id = row["request_id"]
            request_id = wire_id.split(":")[-1]
            routed = {name: routed_ttft_ms(scenario, args.seed, args.requests, request_id, i)
                      for name, i in index.items()}
            measured = measured_verdict(row, routed, labels)
            truth = row["primary_cause"]
            verdict, clear_cut = audit.get(wire_id, ("none", False))
            agree["requests", ""] += 1
            agree["ground truth", ""] += truth == measured
            agree["audit", ""] += verdict == measured
            if truth != verdict:
                agree["disagree", ""] += 1
                agree["disagree: ground truth", ""] += truth == measured
                agree["disagree: audit", ""] += verdict == measured
                agree[truth, verdict] += 1
                lines.append(
                    f"  {wire_id}{' [clear-cut]' if clear_cut else ''}: truth {truth}, audit "
                    f"{verdict}, measured {measured}; ttft {row['actual_ttft_ms']:.0f} ms, "
                    f"modelled on the chosen replica {row['chosen_est_ttft_ms']:.0f} ms; forced: "
                    + ", ".join(f"{k} {v:.0f}" for k, v in routed.items() if v is not None))
    n = agree["requests", ""]
    print(f"slow requests served by a slow replica: {n}; the verdict on measured routing savings "
          f"agrees with the ground truth for {agree['ground truth', '']}, with the audit for "
          f"{agree['audit', '']}")
    print(f"where the ground truth and the audit disagree ({agree['disagree', '']}): the measured "
          f"verdict agrees with the ground truth for {agree['disagree: ground truth', '']}, with "
          f"the audit for {agree['disagree: audit', '']}")
    for (truth, verdict), k in sorted(agree.items(), key=lambda kv: -kv[1]):
        if verdict:
            print(f"  {truth} -> {verdict}: {k}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
