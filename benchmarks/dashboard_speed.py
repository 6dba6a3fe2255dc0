"""Time the queries behind each dashboard page on a store; print seconds per query and page.

    python benchmarks/dashboard_speed.py --db audit.duckdb
    python benchmarks/dashboard_speed.py --synthetic 200000   # marts as tables, n requests
    python benchmarks/dashboard_speed.py --db audit.duckdb --window "last 1 h" --window all

Pages are timed at the dashboard's default time window (the hour ending at the newest request
in the store), the window a person sees first; ``--window`` names others (the sidebar's
choices), and several windows are timed query by query, interleaved, so their ratio is
measured under the same load. The dashboard caches answers (``st.cache_data``) keyed on the
store version, so these are the cold costs a person pays on first view or after each commit.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

WINDOWS: dict[str, timedelta | None] = {
    "last 15 min": timedelta(minutes=15), "last 1 h": timedelta(hours=1),
    "last 6 h": timedelta(hours=6), "last 24 h": timedelta(hours=24), "all": None,
}
"""The sidebar's choices (dashboards/_ui.py WINDOW_SPANS), each up to the newest request."""
DEFAULT_WINDOW = "last 1 h"


Timed = list[tuple[str, Callable[[], Any]]]


def window_of(reader: Any, name: str) -> Any:
    """The sidebar's window ``name`` on this store: up to its newest request."""
    from audit import queries as q

    span = WINDOWS[name]
    last = q.store_range(reader)["last_at"][0]
    if span is None or last is None:
        return q.TimeWindow()
    return q.TimeWindow.ending_at(last, span)


def page_queries(reader: Any, slo: Any, w: Any) -> dict[str, Timed]:
    """Each page's queries at SLO ``slo`` over the time window ``w``, as the page runs them."""
    from audit import queries as q

    worst = q.slow_requests(reader, slo, limit=1, window=w)
    if worst.height == 0:
        worst = reader.query("select request_id, request_key from requests "
                             "order by ttft_ms desc nulls last limit 1")
    rid = str(worst["request_id"][0]) if worst.height else "none"
    key = str(worst["request_key"][0]) if worst.height else "none"
    runs = q.run_list(reader, window=w)["run_id"].to_list()[:2]
    # the drill-down passes when the request started, from the match it lists (as the page does)
    match = q.request_matches(reader, rid, prefer=key, window=w)
    at = match["started_at"][0] if match.height else None
    ident = str(match["request_id"][0]) if match.height else None
    # the page reads the relations once (cached across pages) and passes them on
    known: dict[str, Any] = {}
    return {
        "sidebar": [
            ("store_range", lambda: q.store_range(reader)),
            ("window_counts", lambda: q.window_counts(reader, w)),
        ],
        "overview": [
            ("overview_totals", lambda: q.overview_totals(reader, slo, window=w)),
            ("requests_over_time", lambda: q.requests_over_time(reader, slo, 60, window=w)),
            ("replica_load_over_time", lambda: q.replica_load_over_time(reader, 60, window=w)),
            ("failures_by_kind", lambda: q.failures_by_kind(reader, window=w)),
        ],
        "slow": [
            ("filter_options", lambda: q.filter_options(reader, window=w)),
            ("slow_page", lambda: q.slow_page(reader, slo, window=w)),
        ],
        # the same page with the sidebar's run filter set: the live attribution is scoped to it
        # (the unfiltered page behind the filter's choices is cached from the first view)
        "slow, one run": [
            ("slow_page", lambda: q.slow_page(reader, slo, run=runs[0] if runs else None,
                                              window=w)),
        ],
        # one request, whatever the window (the request list is the window's)
        "request": [
            ("request_matches", lambda: q.request_matches(reader, rid, window=w)),
            ("request_detail", lambda: q.request_detail(reader, key, at=at)),
            ("relation_columns", lambda: known.update(q.relation_columns(reader)) or known),
            ("request_attributions", lambda: q.request_attributions(
                reader, key, slo, at=at, request_id=ident, known=known)),
            ("request_waterfall", lambda: q.request_waterfall(reader, key, at=at)),
            ("request_decisions", lambda: q.request_decisions(reader, key, at=at)),
            ("request_candidates", lambda: q.request_candidates(reader, key, at=at)),
            ("request_spans", lambda: q.request_spans(reader, key, at=at, known=known)),
        ],
        "cache": [
            ("cache_by_replica", lambda: q.cache_by_replica(reader, window=w)),
            ("cache_scatter", lambda: q.cache_scatter(reader, window=w)),
            ("cache_confusion", lambda: q.cache_confusion(reader, window=w)),
            ("cache_misses_over_time", lambda: q.cache_misses_over_time(reader, 60, window=w)),
            ("cache_hit_rate_over_time",
             lambda: q.cache_hit_rate_over_time(reader, 60, window=w)),
        ],
        "telemetry": [
            ("telemetry_age_by_router", lambda: q.telemetry_age_by_router(reader, window=w)),
            ("telemetry_age_over_time",
             lambda: q.telemetry_age_over_time(reader, 60, window=w)),
            ("herding_episodes", lambda: q.herding_episodes(reader, window=w)),
        ],
        "policies": [
            ("run_list", lambda: q.run_list(reader, window=w)),
            ("run_summaries", lambda: q.run_summaries(reader, runs, slo, window=w)),
            ("run_failures", lambda: q.run_failures(reader, runs, window=w)),
        ],
    }


def _rows(out: Any) -> int:
    """Rows a query answered: a frame's height, a SlowPage's table, a dict's entries."""
    if isinstance(out, dict):
        return len(out)
    return int(getattr(getattr(out, "requests", out), "height", 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="store to time (default: $ROUTEAUDIT_DB)")
    ap.add_argument("--synthetic", type=int, metavar="N",
                    help="build a store of N synthetic requests (marts as tables) and time it")
    ap.add_argument("--repeat", type=int, default=3, help="runs per query (median shown)")
    ap.add_argument("--window", action="append", choices=list(WINDOWS),
                    help=f"time window to time the pages at, repeatable (default: {DEFAULT_WINDOW!r}, "
                         "the dashboard's)")
    ap.add_argument("--spacing-ms", type=int, default=100,
                    help="--synthetic: ms between two requests' starts (default 100: 200,000 "
                         "requests span 5.6 h)")
    ap.add_argument("--ttft-ms", type=float, default=None, help="TTFT target (default: audit.load_slo())")
    ap.add_argument("--tpot-ms", type=float, default=None, help="TPOT target (default: audit.load_slo())")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    import audit

    if args.synthetic:
        sys.path.insert(0, str(ROOT / "tests" / "dashboards"))
        from _stores import mart_store

        path = Path(tempfile.mkdtemp()) / "synthetic.duckdb"
        t = time.perf_counter()
        mart_store(path, n=args.synthetic, spacing_ms=args.spacing_ms)
        print(f"built {path} with {args.synthetic:,} requests in {time.perf_counter() - t:.1f} s")
    else:
        db = args.db or os.environ.get("ROUTEAUDIT_DB")
        if not db:
            ap.error("give --db PATH, set ROUTEAUDIT_DB, or use --synthetic N")
        path = Path(db)
    reader = audit.open(path)
    slo = audit.load_slo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    from audit import queries as q

    span = q.store_range(reader).row(0, named=True)
    print(f"store {path}: {span['requests']:,} requests from {span['first_at']} to "
          f"{span['last_at']}; median of {args.repeat} runs per query")
    names = list(dict.fromkeys(args.window or [DEFAULT_WINDOW]))
    pages: dict[str, dict[str, Timed]] = {}
    for name in names:
        w = window_of(reader, name)
        n = q.window_counts(reader, w)["requests"][0]
        print(f"  window {name!r}: {n:,} requests ({w.start} to {w.end})")
        pages[name] = page_queries(reader, slo, w)
    print()

    grand = dict.fromkeys(names, 0.0)
    header = "".join(f"{name:>16s}" for name in names)
    for page in pages[names[0]]:
        totals = dict.fromkeys(names, 0.0)
        print(f"{page:38s}{header}")
        for i, (query, _) in enumerate(pages[names[0]][page]):
            times: dict[str, list[float]] = {name: [] for name in names}
            rows: dict[str, int] = {}
            for _ in range(max(1, args.repeat)):
                for name in names:  # interleaved: each window under the same load
                    fn = pages[name][page][i][1]
                    t = time.perf_counter()
                    out = fn()
                    times[name].append(time.perf_counter() - t)
                    rows[name] = _rows(out)
            cells = ""
            for name in names:
                med = statistics.median(times[name])
                totals[name] += med
                cells += f"{med:9.3f} s {rows[name]:>5d}r"
            print(f"  {query:36s}{cells}")
        for name in names:
            grand[name] += totals[name]
        print(f"  {'page total':36s}" + "".join(f"{totals[n]:9.3f} s       " for n in names) + "\n")
    print("all pages" + "".join(f"  {n}: {grand[n]:.3f} s" for n in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
