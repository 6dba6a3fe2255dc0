"""Time the queries behind each dashboard page on a store; print seconds per query and page.

    python benchmarks/dashboard_speed.py --db audit.duckdb
    python benchmarks/dashboard_speed.py --synthetic 200000   # marts as tables, n requests

The dashboard caches answers (``st.cache_data``) keyed on the store version, so these are the
cold costs a person pays on first view or after each commit. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


Timed = list[tuple[str, Callable[[], Any]]]


def page_queries(reader: Any, slo: Any) -> dict[str, Timed]:
    from audit import queries as q

    worst = q.slow_requests(reader, slo, limit=1)
    if worst.height == 0:
        worst = reader.query("select request_id, request_key from requests "
                             "order by ttft_ms desc nulls last limit 1")
    rid = str(worst["request_id"][0]) if worst.height else "none"
    key = str(worst["request_key"][0]) if worst.height else "none"
    runs = q.run_list(reader)["run_id"].to_list()[:2]
    return {
        "overview": [
            ("overview_totals", lambda: q.overview_totals(reader, slo)),
            ("requests_over_time", lambda: q.requests_over_time(reader, slo, 60)),
            ("replica_load_over_time", lambda: q.replica_load_over_time(reader, 60)),
            ("failures_by_kind", lambda: q.failures_by_kind(reader)),
        ],
        "slow": [
            ("filter_options", lambda: q.filter_options(reader)),
            ("slow_page", lambda: q.slow_page(reader, slo)),
        ],
        # the same page with the sidebar's run filter set: the live attribution is scoped to it
        # (the unfiltered page behind the filter's choices is cached from the first view)
        f"slow, one run ({runs[0] if runs else None})": [
            ("slow_page", lambda: q.slow_page(reader, slo, run=runs[0] if runs else None)),
        ],
        f"request ({rid})": [
            ("request_matches", lambda: q.request_matches(reader, rid)),
            ("request_detail", lambda: q.request_detail(reader, key)),
            ("request_attributions", lambda: q.request_attributions(reader, key, slo)),
            ("request_waterfall", lambda: q.request_waterfall(reader, key)),
            ("request_decisions", lambda: q.request_decisions(reader, key)),
            ("request_candidates", lambda: q.request_candidates(reader, key)),
            ("request_spans", lambda: q.request_spans(reader, key)),
        ],
        "cache": [
            ("cache_by_replica", lambda: q.cache_by_replica(reader)),
            ("cache_scatter", lambda: q.cache_scatter(reader)),
            ("cache_confusion", lambda: q.cache_confusion(reader)),
            ("cache_misses_over_time", lambda: q.cache_misses_over_time(reader, 60)),
            ("cache_hit_rate_over_time", lambda: q.cache_hit_rate_over_time(reader, 60)),
        ],
        "telemetry": [
            ("telemetry_age_by_router", lambda: q.telemetry_age_by_router(reader)),
            ("telemetry_age_over_time", lambda: q.telemetry_age_over_time(reader, 60)),
            ("herding_episodes", lambda: q.herding_episodes(reader)),
        ],
        "policies": [
            ("run_list", lambda: q.run_list(reader)),
            ("run_summaries", lambda: q.run_summaries(reader, runs, slo)),
            ("run_failures", lambda: q.run_failures(reader, runs)),
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="store to time (default: $ROUTEAUDIT_DB)")
    ap.add_argument("--synthetic", type=int, metavar="N",
                    help="build a store of N synthetic requests (marts as tables) and time it")
    ap.add_argument("--repeat", type=int, default=3, help="runs per query (median shown)")
    ap.add_argument("--ttft-ms", type=float, default=None, help="TTFT target (default: audit.load_slo())")
    ap.add_argument("--tpot-ms", type=float, default=None, help="TPOT target (default: audit.load_slo())")
    args = ap.parse_args(argv)

    import audit

    if args.synthetic:
        sys.path.insert(0, str(ROOT / "tests" / "dashboards"))
        from _stores import mart_store

        path = Path(tempfile.mkdtemp()) / "synthetic.duckdb"
        t = time.perf_counter()
        mart_store(path, n=args.synthetic)
        print(f"built {path} with {args.synthetic:,} requests in {time.perf_counter() - t:.1f} s")
    else:
        db = args.db or os.environ.get("ROUTEAUDIT_DB")
        if not db:
            ap.error("give --db PATH, set ROUTEAUDIT_DB, or use --synthetic N")
        path = Path(db)
    reader = audit.open(path)
    slo = audit.load_slo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    n = reader.query("select count(*) as n from requests")["n"][0]
    print(f"store {path}: {n:,} requests; median of {args.repeat} runs per query\n")

    grand = 0.0
    for page, items in page_queries(reader, slo).items():
        total = 0.0
        print(f"{page}")
        for name, fn in items:
            times = []
            rows = 0
            for _ in range(max(1, args.repeat)):
                t = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t)
                rows = (len(out) if isinstance(out, dict)
                        else out.requests.height if isinstance(out, tuple)  # SlowPage
                        else getattr(out, "height", 0))
            med = statistics.median(times)
            total += med
            print(f"  {name:28s} {med:8.3f} s   ({rows} rows)")
        grand += total
        print(f"  {'page total':28s} {total:8.3f} s\n")
    print(f"all pages {grand:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
