"""``routeaudit``: the command line. Each subcommand imports what it needs when it runs.

Every error a user can act on is printed as one line on stderr with a non-zero exit status; a
traceback means a bug in routeaudit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

EXIT_USER_ERROR = 2
_TRACE_HELP = ("a recorded trace to replay: Mooncake JSONL {timestamp (ms), input_length, output_length, "
               "hash_ids} or Azure CSV TIMESTAMP,ContextTokens,GeneratedTokens (plain, .gz or .xz)")
ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DB = ROOT / "sample_data" / "demo.duckdb"


def _add_slo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ttft-slo-ms", type=float, default=None,
                   help="TTFT target in ms (default: config file, $ROUTEAUDIT_TTFT_SLO_MS, or 2000)")
    p.add_argument("--tpot-slo-ms", type=float, default=None,
                   help="TPOT target in ms (default: config file, $ROUTEAUDIT_TPOT_SLO_MS, or 100)")
    p.add_argument("--config", default=None, help="routeaudit.toml with an [slo] table")


def _slo(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from audit import load_slo

    return load_slo(args.config, ttft_ms=args.ttft_slo_ms, tpot_ms=args.tpot_slo_ms)


# ------------------------------------------------------------------------------------------
def cmd_collect(args: argparse.Namespace) -> int:
    from collectors.otlp import default_config, run_collector
    from collectors.tuning_args import tuning_overrides

    config = default_config(
        db_path=args.db,
        http_host=args.host,
        grpc_host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.grpc_port == 0 else args.grpc_port,
        scrape_targets=tuple(args.scrape or ()),
        scrape_interval_s=args.scrape_interval,
        keep_prompts=args.keep_prompts,
        spool=args.spool,
        **({"token": args.token} if args.token else {}),
        **tuning_overrides(args),
    )
    return int(run_collector(config.validate()) or 0)


def cmd_sql(args: argparse.Namespace) -> int:
    import polars as pl

    import audit
    from audit import QueryError

    reader = audit.open(args.db, slo=_slo(args))
    query = args.query if args.query != "-" else sys.stdin.read()
    try:
        frame = reader.query(query)
    except QueryError as exc:
        message = str(exc)
        if "Catalog Error" in message and "does not exist" in message:
            message += f" (relations: {', '.join(reader.relations())})"
        raise QueryError(message) from None
    if args.format == "csv":
        sys.stdout.write(_csv_ready(frame).write_csv())
    elif args.format == "json":
        sys.stdout.write(frame.write_ndjson())
    else:
        with pl.Config(tbl_rows=args.max_rows, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
            print(frame)
    return 0


def _csv_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """CSV holds no nested values: list, array and struct columns become JSON text."""
    import orjson
    import polars as pl

    nested = [name for name, dtype in frame.schema.items() if dtype.is_nested() or dtype == pl.Object]
    return frame.with_columns(
        pl.Series(name, [None if v is None else orjson.dumps(v, default=str).decode()
                         for v in frame[name].to_list()], dtype=pl.String)
        for name in nested
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from routeaudit._demo import run_demo

    return run_demo(db=Path(args.db), scenario=args.scenario, n_requests=args.requests,
                    seed=args.seed, slo=_slo(args), progress=not args.quiet,
                    trace=Path(args.trace) if args.trace else None)


def cmd_attribute(args: argparse.Namespace) -> int:
    import audit
    from audit import queries
    from audit.attribution import summary_text

    reader = audit.open(args.db, slo=_slo(args))
    print(summary_text(reader))
    try:
        lag = queries.describe_lag(queries.relations_freshness(reader))
    except audit.AuditError:
        lag = None  # a store too old to say: the summary stands on its own
    if lag is not None:
        print(f"note: {lag} A running collector rebuilds them in the background; `routeaudit sql` "
              "on the raw tables sees every span.")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import audit
    from audit.attribution import compare_runs
    from routeaudit._report import format_comparison

    slo = _slo(args)
    reader = audit.open(args.db, slo=slo)
    print(format_comparison(compare_runs(reader, args.baseline, args.candidate, slo=slo)))
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    import audit
    from audit.attribution import capacity
    from routeaudit._report import format_capacity

    if not args.target_qps > 0:
        from audit import AuditError

        raise AuditError("--target-qps must be positive")
    cap = capacity(audit.open(args.db), args.target_qps, args.headroom,
                   concurrency=args.concurrency, run=args.run)
    print(format_capacity(cap))
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    import ipaddress

    from audit import AuditError

    token = args.token or os.environ.get("ROUTEAUDIT_DASHBOARD_TOKEN")
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not token:
        raise AuditError(f"refusing to serve the dashboard on {args.host} without a token "
                         "(--token or $ROUTEAUDIT_DASHBOARD_TOKEN)")
    db = Path(args.db) if args.db else SAMPLE_DB
    if not db.exists():
        if args.db:
            from audit import StoreError

            raise StoreError(f"no store at {db}")
        from routeaudit._demo import build_sample_data

        build_sample_data(progress=True)
    env = dict(os.environ, ROUTEAUDIT_DB=str(db.resolve()))
    if token:
        env["ROUTEAUDIT_DASHBOARD_TOKEN"] = token
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboards" / "app.py"),
           "--server.port", str(args.port), "--server.address", args.host,
           "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--client.toolbarMode", "viewer"]
    print(f"routeaudit dashboard on http://{args.host}:{args.port} (store {db})", flush=True)
    return _run_until_stopped(cmd, env)


def _run_until_stopped(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd`` as a child and stop it when this process is stopped (SIGTERM, SIGHUP, Ctrl-C),
    so that stopping ``routeaudit dashboard`` never leaves its server running."""
    import signal

    child = subprocess.Popen(cmd, env=env)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return child.wait()
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def cmd_sample_data(args: argparse.Namespace) -> int:
    from routeaudit._demo import build_sample_data

    path = build_sample_data(progress=not args.quiet, regenerate=args.regenerate)
    print(f"sample store: {path}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from audit.merge import merge

    report = merge(args.db, args.sources, refresh=not args.no_refresh,
                   progress=None if args.quiet else _stderr)
    refreshed = (f"relations refreshed ({report.refresh_kind}, {report.refresh_s:.1f} s)"
                 if report.refresh_kind != "none" else "nothing to refresh")
    print(f"merged {len(report.sources)} store(s) into {report.target}: {report.spans_new} new "
          f"span(s), {report.snapshots_new} new scrape(s); {refreshed}")
    return 0


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


def cmd_spark(args: argparse.Namespace) -> int:
    from audit.spark import command

    conf = {}
    for setting in args.conf:
        key, eq, value = setting.partition("=")
        if not eq or not key.strip():
            from audit import AuditError

            raise AuditError(f"--conf {setting!r}: expected KEY=VALUE, e.g. "
                             "spark.hadoop.fs.s3a.endpoint=http://minio:9000")
        conf[key.strip()] = value
    return command(raw=args.raw, out=args.out, master=args.master, export_from=args.db,
                   driver_memory=args.driver_memory, conf=conf)


def cmd_whatif(args: argparse.Namespace) -> int:
    from routeaudit._whatif import format_whatif, run_whatif

    result = run_whatif(
        Path(args.db), policy=args.policy, run=args.run, since=args.since, until=args.until,
        replicas=args.replicas, telemetry_interval_s=args.telemetry_interval,
        kv_capacity_tokens=args.kv_capacity_tokens,
        out=None if args.no_store else Path(args.out or _whatif_out(args.db)), seed=args.seed,
        slo=_slo(args), progress=not args.quiet, log=_silent if args.quiet else None)
    print(format_whatif(result))
    return 0


def _silent(_text: str) -> None:
    pass


def _whatif_out(db: str) -> Path:
    path = Path(db)
    return path.with_name(path.stem + ".whatif.duckdb")


def cmd_testbed(args: argparse.Namespace) -> int:
    from routeaudit._demo import testbed_command

    return testbed_command(args)


# ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from collectors.tuning_args import add_tuning_arguments  # light: no receiver imported

    parser = argparse.ArgumentParser(
        prog="routeaudit",
        description="Audit routing decisions of LLM serving fleets: collect OTLP spans into "
                    "DuckDB, attribute slow requests to misrouting, eviction or stale telemetry.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("collect", help="receive OTLP spans (HTTP + gRPC) into a store")
    p.add_argument("--db", required=True, help="store file (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (default 4318)")
    p.add_argument("--grpc-port", type=int, default=4317,
                   help="OTLP/gRPC port (default 4317; 0 turns gRPC off)")
    p.add_argument("--token", default=None,
                   help="bearer token required from senders and readers ($ROUTEAUDIT_TOKEN)")
    p.add_argument("--scrape", action="append", metavar="URL",
                   help="replica /metrics URL to sample into snapshots (repeatable)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes")
    p.add_argument("--keep-prompts", action="store_true",
                   help="store prompt/completion text attributes (default: dropped, counted)")
    p.add_argument("--spool", action="store_true",
                   help="acknowledge exports once synced to <db>.spool/ rather than committed: "
                        "larger commits, several times the ingest rate (docs/operations.md)")
    add_tuning_arguments(p)
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("sql", help="run a read-only SQL query on a store (also while collecting)")
    p.add_argument("--db", required=True)
    p.add_argument("query", help="SQL text, or - to read it from stdin")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--max-rows", type=int, default=50, help="rows shown in table format")
    _add_slo_args(p)
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("demo", help="run a testbed scenario end to end into a store and judge it")
    p.add_argument("--db", default="demo.duckdb")
    p.add_argument("--scenario", default="mixed")
    p.add_argument("--requests", type=int, default=None,
                   help="requests to replay (default: 2000, or the whole --trace)")
    p.add_argument("--trace", default=None, metavar="FILE", help=_TRACE_HELP)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_slo_args(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("attribute", help="judge slow requests and print a summary")
    p.add_argument("--db", required=True)
    _add_slo_args(p)
    p.set_defaults(func=cmd_attribute)

    p = sub.add_parser("compare", help="compare two runs that replayed the same arrival trace")
    p.add_argument("--db", required=True)
    p.add_argument("--baseline", required=True, help="run id of the baseline policy")
    p.add_argument("--candidate", required=True, help="run id of the candidate policy")
    _add_slo_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser(
        "whatif", help="replay a store's recorded arrivals under another policy (virtual time)",
        description="Replay the arrivals of a window of a store (arrival time, input and output "
                    "tokens, prefix hashes) in the testbed's simulator, calibrated from the store's "
                    "own executions, under the recorded policy and under --policy; print TTFT, "
                    "TPOT, goodput and failures side by side with the recorded ones, and store "
                    "both simulated runs for `routeaudit compare` and the dashboard "
                    "(docs/whatif.md).")
    p.add_argument("--db", required=True, help="the store holding the recorded traffic")
    p.add_argument("--policy", required=True,
                   help="testbed policy to replay under, e.g. cache_aware, qp_cost, round_robin "
                        "(an unknown name lists them)")
    p.add_argument("--run", default=None, help="the recorded run (required when the window holds several)")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="window start, ISO time (e.g. 2026-01-01T00:00:00Z; naive = UTC)")
    p.add_argument("--until", default=None, metavar="TIME", help="window end (exclusive), ISO time")
    p.add_argument("--replicas", type=int, default=None,
                   help="replicas in the what-if fleet (default: as recorded)")
    p.add_argument("--telemetry-interval", type=float, default=None, metavar="S",
                   help="seconds between the what-if routers' telemetry polls (default: as recorded)")
    p.add_argument("--kv-capacity-tokens", type=int, default=None,
                   help="KV pool per replica in tokens (default: fitted from the KV usage the "
                        "routers saw, else the testbed's 440,000)")
    p.add_argument("--out", default=None, metavar="STORE",
                   help="store the simulated runs go to (default: <db>.whatif.duckdb beside --db)")
    p.add_argument("--no-store", action="store_true",
                   help="do not store the simulated runs (faster: no spans)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated routers")
    p.add_argument("--quiet", action="store_true", help="no progress")
    _add_slo_args(p)
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("capacity", help="replicas needed for a target QPS (Little's law)")
    p.add_argument("--db", required=True)
    p.add_argument("--target-qps", type=float, required=True)
    p.add_argument("--headroom", type=float, default=0.3, help="extra share (default 0.3)")
    p.add_argument("--concurrency", type=float, default=None,
                   help="requests one replica runs at once (default: observed peak)")
    p.add_argument("--run", default=None, help="only this run's executions")
    p.set_defaults(func=cmd_capacity)

    p = sub.add_parser("merge", help="copy what is new in several stores (e.g. collectors behind a "
                                     "load balancer) into one and refresh its relations")
    p.add_argument("--db", required=True, help="target store (created if missing; no collector may hold it)")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="source store files, read through their running collectors if any")
    p.add_argument("--no-refresh", action="store_true",
                   help="copy only: the next merge (or a collector on the target) rebuilds its relations")
    p.add_argument("--quiet", action="store_true", help="no per-source lines on stderr")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("spark", help="build the relations with Apache Spark over partitioned Parquet")
    p.add_argument("--raw", required=True,
                   help="folder of raw tables as <table>/part=<p>/*.parquet (a store's closed-partition "
                        "folder): a local path or a URI such as s3a://bucket/raw")
    p.add_argument("--out", required=True,
                   help="folder the public relations are written to: a local path or a URI")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    p.add_argument("--db", default=None,
                   help="first export this DuckDB store's raw tables and settings to --raw")
    p.add_argument("--driver-memory", default="2g",
                   help="the Spark driver's heap, where a local[N] master runs every task "
                        "(default 2g; about 1M requests on local[2] need more)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting, repeatable (an object store's connector and credentials: "
                        "spark.jars.packages=..., spark.hadoop.fs.s3a.*=...)")
    p.set_defaults(func=cmd_spark)

    p = sub.add_parser("dashboard", help="open the Streamlit dashboard on a store")
    p.add_argument("--db", default=None, help="store (default: the bundled sample data)")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default 127.0.0.1; others need a token)")
    p.add_argument("--token", default=None,
                   help="password the dashboard asks for ($ROUTEAUDIT_DASHBOARD_TOKEN)")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("sample-data", help="rebuild sample_data/demo.duckdb from sample_data/*")
    p.add_argument("--regenerate", action="store_true",
                   help="first replay the sample runs through a collector and rewrite the Parquet files")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_sample_data)

    p = sub.add_parser("testbed", help="emulated fleet: scenarios in virtual time, or live parts")
    tb = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = tb.add_parser("list", help="list the scenarios")
    q.set_defaults(func=cmd_testbed)
    q = tb.add_parser("run", help="run a scenario in virtual time (no store; prints ground truth)")
    q.add_argument("--scenario", default="baseline", help="name, or several joined with '+'")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--requests", type=int, default=None)
    q.add_argument("--policy", default=None, help="override the scenario's routing policy")
    q.add_argument("--ground-truth", default=None, help="write ground truth here (.jsonl/.parquet)")
    q.set_defaults(func=cmd_testbed)
    q = tb.add_parser("replicas", help="serve live emulated replicas (OpenAI API, /metrics)")
    q.add_argument("--n", type=int, default=2, help="number of replicas")
    q.add_argument("--base-port", type=int, default=8001)
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--time-scale", type=float, default=0.05,
                   help="real seconds per simulated second of GPU work")
    q.add_argument("--max-waiting", type=int, default=None, help="queue limit (then 503)")
    q.add_argument("--clock-offset", action="append", default=[], metavar="INDEX=SECONDS",
                   help="skew one replica's span clock, e.g. 1=3.0 (repeatable)")
    q.add_argument("--otlp-endpoint", default="http://127.0.0.1:4318/v1/traces")
    q.add_argument("--run-id", default=None)
    q.set_defaults(func=cmd_testbed)
    q = tb.add_parser("router", help="serve the live reference router in front of replicas")
    q.add_argument("--replica-url", action="append", required=True, metavar="URL")
    q.add_argument("--port", type=int, default=8000)
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--policy", default="round_robin")
    q.add_argument("--telemetry-interval", type=float, default=0.25, help="seconds between polls")
    q.add_argument("--no-pending-correction", action="store_true")
    q.add_argument("--admission-limit", type=int, default=None)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--otlp-endpoint", default="http://127.0.0.1:4318/v1/traces")
    q.add_argument("--run-id", default=None)
    q.set_defaults(func=cmd_testbed)
    q = tb.add_parser("load", help="replay a workload against a URL with the instrumented client")
    q.add_argument("--url", required=True, help="router (or replica) base URL")
    q.add_argument("--workload", default="hot_prefix", help="aibrix, mooncake, hot_prefix, …")
    q.add_argument("--trace", default=None, metavar="FILE", help=_TRACE_HELP + " (instead of --workload)")
    q.add_argument("--requests", type=int, default=100)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--concurrency", type=int, default=16)
    q.add_argument("--stream-fraction", type=float, default=0.5)
    q.add_argument("--max-tokens", type=int, default=256)
    q.add_argument("--time-scale", type=float, default=1.0, help="multiplies arrival offsets")
    q.add_argument("--model", default=None,
                   help="the model name sent in each request (routers such as SMG require one)")
    q.add_argument("--otlp-endpoint", default="http://127.0.0.1:4318/v1/traces")
    q.add_argument("--run-id", default=None)
    q.set_defaults(func=cmd_testbed)
    return parser


_USER_ERRORS = (
    # (module, class): errors a user can act on. Checked only if the module was imported, so the
    # command line never imports a package just to recognise its errors.
    ("audit._errors", "AuditError"),
    ("collectors.otlp._errors", "CollectorError"),
    ("testbed._errors", "TestbedError"),
    ("routeaudit._whatif", "WhatIfError"),
)


def _is_user_error(exc: BaseException) -> bool:
    for module, name in _USER_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except Exception as exc:
        if not _is_user_error(exc):
            raise
        print(f"routeaudit {args.command}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
            print(f"routeaudit {args.command}: {exc.strerror}: {exc.filename}", file=sys.stderr)
            return EXIT_USER_ERROR
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
