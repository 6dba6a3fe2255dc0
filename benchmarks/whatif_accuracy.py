"""What-if accuracy on recorded testbed runs (docs/whatif.md, "Accuracy").

For each scenario, every policy's run is recorded through the real path (OTel SDK -> OTLP/HTTP
-> collector -> DuckDB store). Then each recorded run is replayed from the store alone
(``routeaudit whatif``, simulated runs not stored): under its own policy (the replay, compared
with the recording: the calibrated model's error) and under each other policy (the what-if,
compared with that policy's own recording of the same arrivals: the prediction error). Prints
one line per (recorded run, policy replayed) with TTFT p50 and p90, recorded and simulated, and
their relative error, then whether the ranking of the policies by TTFT p50 and by p90 is the
recorded one.

    python3 benchmarks/whatif_accuracy.py [--requests 600] [--seed 0]
        [--scenarios baseline,mixed] [--policies round_robin,cache_aware,qp_cost]
        [--workdir DIR] [--reuse]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402

import testbed  # noqa: E402
from collectors.otlp import Collector, default_config  # noqa: E402
from routeaudit._whatif import run_whatif  # noqa: E402
from testbed.emit import OTelEmitter  # noqa: E402


def record(db: Path, scenario: str, policies: list[str], n: int, seed: int) -> dict[str, str]:
    """Record one run per policy into ``db``; policy -> run id."""
    runs = {}
    with Collector(default_config(db_path=db, http_port=0, grpc_port=None)) as collector:
        for policy in policies:
            emitter = OTelEmitter(OTLPSpanExporter(endpoint=collector.traces_url, timeout=60))
            summary = testbed.run_scenario(scenario, seed=seed, n_requests=n, policy=policy,
                                           emitter=emitter, progress=False)
            runs[policy] = summary.run_id
    return runs


def _err(sim: float | None, rec: float | None) -> str:
    if sim is None or rec is None or rec == 0:
        return "    -"
    return f"{(sim / rec - 1) * 100:+5.0f}%"


def _order(values: dict[str, float | None]) -> list[str]:
    return sorted(values, key=lambda p: float("inf") if values[p] is None else values[p])  # type: ignore[arg-type,return-value]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", default="baseline,mixed")
    ap.add_argument("--policies", default="round_robin,cache_aware,qp_cost")
    ap.add_argument("--workdir", default=None, help="keep the stores here (default: a temp dir)")
    ap.add_argument("--reuse", action="store_true", help="reuse stores already in --workdir")
    args = ap.parse_args()
    policies = args.policies.split(",")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="whatif-accuracy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for scenario in args.scenarios.split(","):
        db = workdir / f"{scenario}-{args.requests}-s{args.seed}.duckdb"
        started = time.perf_counter()
        if args.reuse and db.exists():
            runs = {p: f"{scenario}-{p}-s{args.seed}" for p in policies}
        else:
            for path in (db, Path(f"{db}.wal")):
                path.unlink(missing_ok=True)
            runs = record(db, scenario, policies, args.requests, args.seed)
        print(f"\n{scenario}: {args.requests} Mooncake requests per run, recorded in "
              f"{time.perf_counter() - started:.0f} s ({db})")
        print(f"{'recorded run':28s} {'replayed as':12s} {'p50 rec':>8s} {'sim':>8s} {'err':>6s}"
              f" {'p90 rec':>8s} {'sim':>8s} {'err':>6s}")
        recorded_p50: dict[str, float | None] = {}
        recorded_p90: dict[str, float | None] = {}
        predicted: dict[str, dict[str, tuple[float | None, float | None]]] = {}
        for source, run_id in runs.items():
            for target in policies:
                result = run_whatif(db, policy=target, run=run_id, out=None, progress=False,
                                    log=lambda _t: None)
                rec = result.recorded
                recorded_p50[source], recorded_p90[source] = rec.ttft_p50_ms, rec.ttft_p90_ms
                sim = result.replay if target == source else result.whatif
                assert sim is not None
                predicted.setdefault(source, {})[target] = (sim.ttft_p50_ms, sim.ttft_p90_ms)
        for source, run_id in runs.items():
            for target in policies:
                p50, p90 = predicted[source][target]
                r50, r90 = recorded_p50[target], recorded_p90[target]
                print(f"{run_id:28s} {target:12s} {r50 or 0:8.0f} {p50 or 0:8.0f} {_err(p50, r50)}"
                      f" {r90 or 0:8.0f} {p90 or 0:8.0f} {_err(p90, r90)}")
        for label, recorded in (("p50", recorded_p50), ("p90", recorded_p90)):
            truth = _order(recorded)
            for source in runs:
                index = 0 if label == "p50" else 1
                got = _order({t: predicted[source][t][index] for t in policies})
                print(f"ranking by TTFT {label} from {runs[source]}'s traffic: "
                      f"{' < '.join(got)} ({'as recorded' if got == truth else 'recorded: ' + ' < '.join(truth)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
