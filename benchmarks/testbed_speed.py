"""Testbed speed: the whole Mooncake conversation trace (12,031 requests) on 8 replicas in
virtual time, without span emission. Prints wall time and ratios.

    python3 benchmarks/testbed_speed.py [--scenario baseline] [--policy qp_cost] [--n N]
"""

from __future__ import annotations

import argparse
import time

import testbed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scenario", default="baseline")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--n", type=int, default=None, help="first N requests (default: all)")
    ap.add_argument("--replicas", type=int, default=8)
    args = ap.parse_args()
    t = time.perf_counter()
    sim = testbed.prepare_scenario(args.scenario, n_requests=args.n, replicas=args.replicas,
                                   policy=args.policy)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    sim.run()
    run_s = time.perf_counter() - t
    t = time.perf_counter()
    rows = sim.ground_truth_rows()
    gt_s = time.perf_counter() - t
    s = sim.summary(run_s)
    print(f"scenario={s.scenario} policy={s.policy} requests={s.n_requests} replicas={args.replicas}")
    print(f"load {load_s:6.2f} s   simulate+label {run_s:6.2f} s   ground-truth rows {gt_s:6.2f} s ({len(rows)})")
    print(f"virtual time {s.sim_duration_s:8.1f} s   speed-up x{s.sim_duration_s / run_s:8.1f}")
    print(f"requests/s (wall) {s.n_requests / run_s:8.0f}   events {s.events}   events/s {s.events / run_s:8.0f}")
    print(f"TTFT p50 {s.ttft_p50_ms:.0f} ms  p90 {s.ttft_p90_ms:.0f} ms  p99 {s.ttft_p99_ms:.0f} ms  "
          f"cached {s.cached_token_fraction:.1%}  slow {s.n_slow}")
    print(f"primary causes {s.primary_cause_counts}")


if __name__ == "__main__":
    main()
