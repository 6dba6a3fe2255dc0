"""Testbed speed: the Mooncake conversation trace (12,031 requests) on 8 replicas in virtual
time. Prints wall time, simulated requests per wall second and, with ``--emit``, the same
including span emission.

    python3 benchmarks/testbed_speed.py [--scenario baseline] [--policy qp_cost] [--n N]
        [--emit none|recording|otel-memory|otel-memory-sdk] [--no-ground-truth]
        [--baseline-tree DIR] [--rounds K]

``--emit recording`` hands every finished request to an in-process ``RecordingEmitter``;
``otel-memory`` emits client, router and replica spans through the real OpenTelemetry SDK
(``BatchSpanProcessor``) into an ``InMemorySpanExporter``, so it measures span construction
and the SDK, not a network hop; ``otel-memory-sdk`` the same with every span started by the
SDK's ``start_span`` (``OTelEmitter(direct_spans=False)``).

``--no-ground-truth`` runs ``Simulation(ground_truth=False)`` (no decision-time truth, no
labels: what a what-if replay needs); a ``testbed`` without that option runs with ground truth
and the figure says so (``ground_truth`` in the output).

``--baseline-tree DIR`` runs the same measurement with the ``testbed`` package of another
checkout (for example ``git archive <rev> testbed | tar -x -C DIR``) in a subprocess, alternating
with this tree ``--rounds`` times, and prints both figures and their ratio from one run. Rates
are given per wall second and per CPU second of the process (``time.process_time``, exporter
threads included): on a shared machine the CPU figure is the steadier one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(REPO))  # run from a checkout without PYTHONPATH


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import testbed
    from testbed.emit import RecordingEmitter, SpanEmitter

    emitter: SpanEmitter | None = None
    mem: Any = None
    if args.emit == "recording":
        emitter = RecordingEmitter()
    elif args.emit in ("otel-memory", "otel-memory-sdk"):
        import inspect

        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from testbed._otel_emit import OTelEmitter

        mem = InMemorySpanExporter()
        kw: dict[str, Any] = {}
        if "direct_spans" in inspect.signature(OTelEmitter).parameters:
            kw["direct_spans"] = args.emit == "otel-memory"
        emitter = OTelEmitter(mem, **kw)
    t = time.perf_counter()
    sim = testbed.prepare_scenario(args.scenario, n_requests=args.n, replicas=args.replicas,
                                   policy=args.policy, emitter=emitter)
    ground_truth = not args.no_ground_truth or not hasattr(sim, "ground_truth")
    sim.ground_truth = ground_truth  # read by run(); an older testbed ignores it
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    c = time.process_time()
    sim.run()
    if emitter is not None:
        emitter.close()
    run_s = time.perf_counter() - t
    cpu_s = time.process_time() - c
    t = time.perf_counter()
    rows = sim.ground_truth_rows() if ground_truth else []
    gt_s = time.perf_counter() - t
    s = sim.summary(run_s)
    return {
        "scenario": s.scenario, "policy": s.policy, "requests": s.n_requests, "load_s": load_s,
        "run_s": run_s, "cpu_s": cpu_s, "gt_s": gt_s, "rows": len(rows), "virtual_s": s.sim_duration_s,
        "events": s.events, "spans": len(mem.get_finished_spans()) if mem is not None else None,
        "ttft": (s.ttft_p50_ms, s.ttft_p90_ms, s.ttft_p99_ms), "cached": s.cached_token_fraction,
        "slow": s.n_slow, "causes": s.primary_cause_counts, "ground_truth": ground_truth,
    }


def _print(m: dict[str, Any], label: str = "") -> None:
    run_s = m["run_s"]
    print(f"{label}scenario={m['scenario']} policy={m['policy']} requests={m['requests']} "
          f"ground_truth={m.get('ground_truth', True)}")
    print(f"{label}load {m['load_s']:6.2f} s   simulate+label{'+emit' if m['spans'] is not None else ''} "
          f"{run_s:6.2f} s   ground-truth rows {m['gt_s']:6.2f} s ({m['rows']})")
    print(f"{label}virtual time {m['virtual_s']:8.1f} s   speed-up x{m['virtual_s'] / run_s:8.1f}")
    print(f"{label}requests/s (wall) {m['requests'] / run_s:8.0f}   events {m['events']}   "
          f"events/s {m['events'] / run_s:8.0f}" + (f"   spans {m['spans']}" if m["spans"] else ""))
    print(f"{label}requests/s (CPU)  {m['requests'] / m['cpu_s']:8.0f}   CPU {m['cpu_s']:6.2f} s")
    p50, p90, p99 = m["ttft"]
    print(f"{label}TTFT p50 {p50:.0f} ms  p90 {p90:.0f} ms  p99 {p99:.0f} ms  "
          f"cached {m['cached']:.1%}  slow {m['slow']}")
    print(f"{label}primary causes {m['causes']}")


def _child(tree: Path, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(REPO)]))
    out = subprocess.run([sys.executable, __file__, "--json", *argv], env=env, check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="baseline")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--n", type=int, default=None, help="first N requests (default: all)")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--emit", choices=["none", "recording", "otel-memory", "otel-memory-sdk"],
                    default="none")
    ap.add_argument("--no-ground-truth", action="store_true",
                    help="simulate without decision-time truth and labels")
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="another checkout whose testbed package is measured alternately")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(_measure(args)))
        return
    if args.baseline_tree is None:
        _print(_measure(args))
        return
    argv = [f"--scenario={args.scenario}", f"--replicas={args.replicas}", f"--emit={args.emit}"]
    if args.policy:
        argv.append(f"--policy={args.policy}")
    if args.n:
        argv.append(f"--n={args.n}")
    if args.no_ground_truth:
        argv.append("--no-ground-truth")
    rates: dict[tuple[str, str], list[float]] = {}
    last: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):  # alternate so both see the same machine load
        for name, tree in (("before", args.baseline_tree.resolve()), ("after", REPO)):
            m = _child(tree, argv)
            rates.setdefault((name, "wall"), []).append(m["requests"] / m["run_s"])
            rates.setdefault((name, "CPU"), []).append(m["requests"] / m["cpu_s"])
            last[name] = m
    for name in ("before", "after"):
        _print(last[name], f"[{name}] ")
    for clock in ("wall", "CPU"):
        b, a = (statistics.median(rates[(n, clock)]) for n in ("before", "after"))
        print(f"requests/s ({clock}), median of {args.rounds}: before {b:.0f}  after {a:.0f}  "
              f"x{a / b:.2f}")
    keys = ["ttft", "slow", "spans"]
    if last["before"]["ground_truth"] == last["after"]["ground_truth"]:
        keys.append("causes")
    same = {k: last["before"][k] == last["after"][k] for k in keys}
    print(f"same outcomes before/after: {same}")


if __name__ == "__main__":
    main()
