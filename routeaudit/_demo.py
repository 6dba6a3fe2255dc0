"""The main job (``routeaudit demo``), the bundled sample data, and the testbed commands.

The demo takes the path a user's fleet takes: the testbed's spans go through the real
OpenTelemetry SDK and OTLP/HTTP exporter to a real collector on a loopback port, which commits
them to the DuckDB store; the attribution then reads only the store. The testbed's ground truth
goes to a separate file beside the store, which nothing under ``audit/`` reads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from audit import SLO

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DIR = ROOT / "sample_data"
SAMPLE_DB = SAMPLE_DIR / "demo.duckdb"
SAMPLE_RUNS = (
    # (scenario, policy): the same arrival trace replayed under two policies, for comparison.
    ("mixed", "round_robin"),
    ("mixed", "qp_cost"),
)
SAMPLE_REQUESTS = 400
DEFAULT_DEMO_REQUESTS = 2000


def _ground_truth_path(db: Path) -> Path:
    return db.with_name(db.stem + ".groundtruth.jsonl")


def _remove_store(db: Path) -> None:
    for path in (db, Path(f"{db}.wal")):
        if path.exists():
            path.unlink()


def replay_into_store(db: Path, runs: list[tuple[str, str | None]], *, n_requests: int | None,
                      seed: int, progress: bool, ground_truth: Path | None,
                      trace: Path | None = None) -> list[Any]:
    """Run testbed scenarios through OTel → OTLP/HTTP → a collector writing ``db``."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    import testbed
    from collectors.otlp import Collector, default_config
    from testbed.emit import OTelEmitter
    from testbed.workloads import load_trace

    # A recorded trace is read (and checked) before the collector starts: a bad file is one line.
    workload: Any = "mooncake" if trace is None else load_trace(str(trace), limit=n_requests)
    summaries = []
    config = default_config(db_path=db, http_port=0, grpc_port=None)
    with Collector(config) as collector:
        if progress:
            print(f"collector listening on {collector.traces_url} (OTLP/HTTP) → {db}", flush=True)
        for i, (scenario, policy) in enumerate(runs):
            gt = None
            if ground_truth is not None:
                gt = str(ground_truth if len(runs) == 1 else
                         ground_truth.with_name(f"{ground_truth.stem}.{i}{ground_truth.suffix}"))
            emitter = OTelEmitter(OTLPSpanExporter(endpoint=collector.traces_url, timeout=60))
            summaries.append(testbed.run_scenario(
                scenario, seed=seed, n_requests=n_requests, emitter=emitter,
                ground_truth_path=gt, progress=progress, policy=policy, workload=workload))
    return summaries


def run_demo(*, db: Path, scenario: str, n_requests: int | None, seed: int, slo: SLO | None,
             progress: bool, trace: Path | None = None) -> int:
    """``routeaudit demo``: replay a scenario into a fresh store, judge it, print a summary."""
    import audit
    from audit.attribution import summary_text

    if db.exists():
        print(f"replacing the existing store {db}", flush=True)
        _remove_store(db)
    # A trace of one's own is replayed whole unless asked otherwise.
    n = n_requests if n_requests is not None or trace is not None else DEFAULT_DEMO_REQUESTS
    started = time.perf_counter()
    (summary,) = replay_into_store(db, [(scenario, None)], n_requests=n, seed=seed,
                                   progress=progress, ground_truth=_ground_truth_path(db), trace=trace)
    elapsed = time.perf_counter() - started
    reader = audit.open(db, slo=slo)
    spans = reader.query("select count(*) as n from raw_spans")["n"][0]
    stored = reader.query("select count(*) as n from requests where has_client")["n"][0]
    source = f" of {trace}" if trace is not None else ""
    print(f"\nreplayed {summary.n_requests} requests{source} under scenario {scenario!r} "
          f"(run {summary.run_id}) in {elapsed:.1f} s; {spans} spans stored in {db}")
    if stored != summary.n_requests:
        print(f"warning: {summary.n_requests - stored} requests did not reach the store "
              "(spans lost between the SDK and the collector)", file=sys.stderr)
    print(summary_text(reader))
    print(f"\nground truth (testbed only, never read by the audit): {_ground_truth_path(db)}")
    print(f"next: routeaudit dashboard --db {db}    or    routeaudit sql --db {db} "
          "\"select * from slow_requests order by excess_ms desc limit 20\"")
    return 0


def load_sample_data(store: Any) -> None:
    """Append the committed sample raw tables (``sample_data/*.parquet``) to ``store``."""
    import pyarrow.parquet as pq

    from audit.schema import RAW_TABLES

    tables = {t: pq.read_table(SAMPLE_DIR / f"{t}.parquet") for t in RAW_TABLES
              if (SAMPLE_DIR / f"{t}.parquet").exists()}
    store.append(spans=tables.get("raw_spans"), events=tables.get("raw_span_events"),
                 snapshots=tables.get("raw_snapshots"))


def write_sample_store(path: Path) -> Path:
    """A store at ``path`` holding the committed sample data, its relations built; returns it."""
    from audit import Store

    store = Store(path)
    try:
        load_sample_data(store)
    finally:
        store.close()
    return path


def build_sample_data(*, progress: bool = True, regenerate: bool = False) -> Path:
    """Build ``sample_data/demo.duckdb`` from the committed Parquet files.

    With ``regenerate``, first replay :data:`SAMPLE_RUNS` through the collector and export the
    raw tables to ``sample_data/*.parquet`` (what is committed).
    """
    import duckdb

    from audit.schema import RAW_TABLES

    if regenerate:
        scratch = SAMPLE_DIR / "regenerate.duckdb"
        _remove_store(scratch)
        replay_into_store(scratch, list(SAMPLE_RUNS), n_requests=SAMPLE_REQUESTS, seed=0,
                          progress=progress, ground_truth=None)
        con = duckdb.connect(str(scratch), read_only=True)
        try:
            for table in RAW_TABLES:
                order = "trace_id, span_id" if table != "raw_snapshots" else "target, scraped_ns"
                if table == "raw_span_events":
                    order += ", event_index"
                con.sql(f"select * from {table} order by {order}").to_parquet(
                    str(SAMPLE_DIR / f"{table}.parquet"), compression="zstd")
        finally:
            con.close()
        _remove_store(scratch)
    _remove_store(SAMPLE_DB)
    write_sample_store(SAMPLE_DB)
    if progress:
        print(f"sample store built: {SAMPLE_DB}", file=sys.stderr)
    return SAMPLE_DB


def testbed_command(args: argparse.Namespace) -> int:
    """``routeaudit testbed list|run|replicas|router|load``."""
    import testbed

    if args.action == "list":
        for name, scenario in testbed.SCENARIOS.items():
            print(f"{name:20s} {scenario.description}")
        print("\ncombine scenarios with '+', e.g. stale_telemetry+slow_replica")
        return 0
    if args.action == "run":
        summary = testbed.run_scenario(args.scenario, seed=args.seed, n_requests=args.requests,
                                       policy=args.policy, ground_truth_path=args.ground_truth,
                                       progress=True)
        print(f"{summary.n_requests} requests, {summary.n_finished} finished, "
              f"{summary.n_rejected} rejected, {summary.n_slow} slow; TTFT p50 "
              f"{summary.ttft_p50_ms:.0f} ms, p99 {summary.ttft_p99_ms:.0f} ms; "
              f"simulated {summary.sim_duration_s:.0f} s in {summary.wall_s:.1f} s")
        print("primary causes (ground truth):", dict(sorted(summary.primary_cause_counts.items())))
        return 0

    from testbed import live

    if args.action == "replicas":
        live.serve_replicas(args.n, args.base_port, host=args.host, time_scale=args.time_scale,
                            otlp_endpoint=args.otlp_endpoint or None,
                            clock_offsets_s=_offsets(args.clock_offset),
                            max_waiting=args.max_waiting, run_id=args.run_id)
        return 0
    if args.action == "router":
        live.serve_router(args.replica_url, args.port, args.policy, host=args.host,
                          telemetry_interval_s=args.telemetry_interval,
                          pending_correction=not args.no_pending_correction,
                          admission_limit=args.admission_limit,
                          otlp_endpoint=args.otlp_endpoint or None, run_id=args.run_id,
                          seed=args.seed)
        return 0
    from collectors.client import run_load
    from testbed.workloads import load_trace

    workload = args.workload if args.trace is None else load_trace(args.trace, limit=args.requests)
    requests = live.live_requests(workload, args.requests, args.seed,
                                  stream_fraction=args.stream_fraction,
                                  max_tokens=args.max_tokens, time_scale=args.time_scale,
                                  model=args.model)
    provider = live.make_tracer_provider("client", "client-0", otlp_endpoint=args.otlp_endpoint,
                                         run_id=args.run_id)
    try:
        results = run_load(args.url, requests, args.concurrency, progress=True,
                           run_id=args.run_id, tracer_provider=provider)
    finally:
        if provider is not None:
            provider.shutdown()
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    print(f"{len(results)} requests sent: {dict(sorted(by_status.items()))}")
    failed = next((r for r in results if r.status != "ok"), None)
    if failed is not None:
        # The first failure usually says what is wrong for all (a missing model, a wrong URL).
        print(f"first failure ({failed.request_id}): {failed.status}: {failed.error or 'no detail'}")
    return 0


def _offsets(items: list[str]) -> dict[int, float]:
    from testbed import ConfigError

    out: dict[int, float] = {}
    for item in items:
        index, sep, seconds = item.partition("=")
        try:
            out[int(index)] = float(seconds)
        except ValueError:
            raise ConfigError(f"--clock-offset wants INDEX=SECONDS, got {item!r}") from None
        if not sep:
            raise ConfigError(f"--clock-offset wants INDEX=SECONDS, got {item!r}")
    return out
