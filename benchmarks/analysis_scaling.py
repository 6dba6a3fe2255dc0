"""Analysis scaling (measure only): how ``Store.refresh()`` and a few mart/attribution queries grow
with the number of requests in a store, and how much disk a million requests take.

For each size the virtual-time testbed runs the ``hot_prefix`` workload (synthetic, any size) on
8 replicas (``--scenario mixed --workload scenario``: the demo's evictions and preemptions, on its
finite trace) and an in-process emitter writes its spans straight into a fresh store: the real OTel
SDK spans are encoded with ``encode_spans`` (what the OTLP exporter sends), decoded by
``collectors.otlp._decode.decode`` (what the collector does) and appended with ``Store.append``
in batches of ``--batch`` spans. No sockets, so the curve is about the analysis, not ingest.

Then: ``Store.refresh()`` is timed as a whole and relation by relation, followed by a few queries.

    python3 benchmarks/analysis_scaling.py                 # 10k and 100k requests
    python3 benchmarks/analysis_scaling.py --sizes 10000 100000 1000000
    python3 benchmarks/analysis_scaling.py --keep /tmp/scaling   # keep the stores

Emission through the SDK costs a few ms of wall time per request (it dominates the run time for
large sizes); ``--reuse`` skips generation when ``<keep>/requests_<n>.duckdb`` already exists.

``--tile-from B`` builds sizes above B by tiling: one testbed run of B requests is generated as
above, then copied into the raw tables until the size is reached, each copy shifted in time past
the previous one (run length + 1 h, so no copy can see another's executions, telemetry or cached
blocks) with its own trace ids, request ids and run ids. Every copy is analysed like distinct
traffic; what tiling does not give is new workload shapes (documented in docs/performance.md).

    python3 benchmarks/analysis_scaling.py --tile-from 25000 --sizes 25000 100000 1000000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUERIES: dict[str, str] = {
    "requests: count + p99 ttft": "select count(*), quantile_cont(ttft_ms, 0.99) from requests",
    "requests: by replica": "select chosen_replica, count(*), avg(ttft_ms) from requests group by 1",
    "decisions: by policy": "select policy, count(*) from decisions group by 1",
    "candidates: age p90": "select quantile_cont(telemetry_age_ms, 0.9) from candidates",
    "attributions: primary causes": "select cause, count(*), sum(excess_ms) from attributions "
                                    "where is_primary group by cause",
    "slo_summary": "select * from slo_summary",
}


class StoreExporter:
    """An SDK ``SpanExporter`` that decodes like the collector (an OTLP/protobuf body, the native
    decoder) and appends to a Store."""

    def __init__(self, store: Any, batch: int) -> None:
        self.store = store
        self.batch = batch
        self.buf: list[Any] = []
        self.spans = 0
        self.append_s = 0.0
        self.decode_s = 0.0

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.buf.extend(spans)
        if len(self.buf) >= self.batch:
            self._flush()
        return SpanExportResult.SUCCESS

    def _flush(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        from collectors.otlp._decode import decode_protobuf

        if not self.buf:
            return
        spans, self.buf = self.buf, []
        t = time.perf_counter()
        batch = decode_protobuf(encode_spans(spans).SerializeToString(), time.time_ns())
        t2 = time.perf_counter()
        self.store.append(spans=batch.spans, events=batch.events)
        self.append_s += time.perf_counter() - t2
        self.decode_s += t2 - t
        self.spans += len(spans)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self._flush()
        return True

    def shutdown(self) -> None:
        self._flush()


def generate(path: Path, n: int, batch: int, scenario: str = "baseline",
             workload: str | None = "hot_prefix") -> dict[str, float]:
    import testbed
    from audit._store import Store
    from testbed.emit import OTelEmitter

    store = Store(path, refresh_interval_s=3600)
    exporter = StoreExporter(store, batch)
    emitter = OTelEmitter(exporter, batch=False)  # synchronous: the exporter batches itself
    t = time.perf_counter()
    kwargs = {"workload": workload} if workload else {}
    sim = testbed.prepare_scenario(scenario, n_requests=n, replicas=8, emitter=emitter, **kwargs)
    sim.run()
    emitter.close()
    gen_s = time.perf_counter() - t
    store._dirty = False  # the first refresh is timed below, not on close
    store.close()
    return {"generate_s": gen_s, "spans": exporter.spans, "decode_s": exporter.decode_s,
            "append_s": exporter.append_s}


_ID_COLUMNS = ("a_request_id", "a_gen_ai_request_id", "a_router_request_id", "a_rid")
_RUN_COLUMNS = ("a_run_id", "r_run_id")
_SPAN_NS = ("start_ns", "end_ns", "received_ns", "a_decision_time_ns")
_EVENT_NS = ("time_ns", "c_telemetry_ts_ns")


def tile(base: Path, path: Path, n: int) -> dict[str, float]:
    """Copy ``base`` to ``path`` and append shifted copies of its raw rows until ``n`` requests."""
    import shutil

    import duckdb

    t0 = time.perf_counter()
    shutil.copyfile(base, path)
    con = duckdb.connect(os.fspath(path))
    base_n = con.sql("select count(distinct a_request_id) from raw_spans").fetchall()[0][0]
    lo, hi = con.sql("select min(start_ns), max(end_ns) from raw_spans").fetchall()[0]
    shift = hi - lo + 3600 * 10**9
    copies = -(-n // base_n)
    con.execute("create temp table base_spans as select * from raw_spans")
    con.execute("create temp table base_events as select * from raw_span_events")
    for k in range(1, copies):
        tag = f"-t{k}"
        trace = f"md5(trace_id || '{tag}')"
        span_repl = [f"{trace} as trace_id"]
        span_repl += [f"{c} + {k * shift} as {c}" for c in _SPAN_NS]
        span_repl += [f"{c} || '{tag}' as {c}" for c in _RUN_COLUMNS]
        # request ids are '<run_id>:<n>': keep the run prefix consistent with the run columns
        span_repl += [f"replace({c}, coalesce(r_run_id, a_run_id) || ':', "
                      f"coalesce(r_run_id, a_run_id) || '{tag}:') as {c}" for c in _ID_COLUMNS]
        con.execute(f"insert into raw_spans by name select * replace ({', '.join(span_repl)}) "
                    "from base_spans")
        ev_repl = [f"{trace} as trace_id"] + [f"{c} + {k * shift} as {c}" for c in _EVENT_NS]
        con.execute(f"insert into raw_span_events by name select * replace ({', '.join(ev_repl)}) "
                    "from base_events")
        print(f"  tiled copy {k}/{copies - 1}", end="\r", file=sys.stderr, flush=True)
    # the copies' keys, as Store.append stores them with the spans
    from audit import _span_keys

    con.execute(_span_keys.SPAN_KEYS_DDL)
    _span_keys.fill(con)
    con.execute("checkpoint")
    con.close()
    return {"tile_s": time.perf_counter() - t0, "copies": copies, "base_requests": base_n}


def timed_refresh(path: Path) -> tuple[float, list[tuple[str, str, float]]]:
    """``audit._relations.refresh`` with each relation timed."""
    import duckdb

    from audit import _relations
    from audit._store import _tune

    con = duckdb.connect(os.fspath(path))
    _tune(con)
    out: list[tuple[str, str, float]] = []
    t0 = time.perf_counter()
    _relations.refresh(con, on_built=lambda rel, kind, s: out.append((rel.name, kind, s)))
    total = time.perf_counter() - t0
    con.execute("checkpoint")
    con.close()
    return total, out


def measure(path: Path, n: int, query_timeout_s: float) -> dict[str, Any]:
    from audit import Store, load_slo

    res: dict[str, Any] = {}
    res["refresh_by_relation_s"], res["relations"] = timed_refresh(path)
    store = Store(path, refresh_interval_s=3600)
    try:
        t = time.perf_counter()
        store.refresh()
        res["store_refresh_s"] = time.perf_counter() - t
        q: dict[str, float] = {}
        variables = load_slo().variables()
        for name, sql in QUERIES.items():
            cur = store._con.cursor()  # own cursor, so a slow query can be interrupted
            for var, value in variables.items():
                cur.execute(f"set variable {var} = ?", [value])
            timer = threading.Timer(query_timeout_s, cur.interrupt)
            timer.start()
            t = time.perf_counter()
            try:
                cur.sql(sql).to_arrow_table()
                q[name] = time.perf_counter() - t
            except Exception as exc:  # noqa: BLE001 - report, do not stop the curve
                q[name] = float("inf") if time.perf_counter() - t >= query_timeout_s else float("nan")
                print(f"  query {name!r} failed after {time.perf_counter() - t:.1f} s: "
                      f"{str(exc).splitlines()[0]}", file=sys.stderr)
            finally:
                timer.cancel()
                cur.close()
        res["queries"] = q
        res["rows"] = {t: store.query_arrow(f"select count(*) from {t}").column(0)[0].as_py()
                       for t in ("raw_spans", "raw_span_events", "requests", "candidates")}
    finally:
        store.close()
    size = path.stat().st_size
    wal = Path(f"{path}.wal")
    res["bytes"] = size + (wal.stat().st_size if wal.exists() else 0)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--batch", type=int, default=4096, help="spans per Store.append")
    ap.add_argument("--keep", default=None, help="folder for the stores (default: a temp folder)")
    ap.add_argument("--reuse", action="store_true", help="reuse stores already in --keep")
    ap.add_argument("--tile-from", type=int, default=None, metavar="B",
                    help="build sizes above B by tiling one generated run of B requests")
    ap.add_argument("--query-timeout", type=float, default=120.0,
                    help="seconds before a query is interrupted (reported as inf)")
    ap.add_argument("--top", type=int, default=8, help="relations listed per size")
    ap.add_argument("--scenario", default="baseline",
                    help="testbed scenario (`routeaudit testbed list`); `mixed` has evictions, "
                         "preemptions and many cache shortfalls, which hot_prefix does not")
    ap.add_argument("--workload", default="hot_prefix",
                    help="testbed workload; 'scenario' keeps the scenario's own (a trace is finite)")
    args = ap.parse_args()
    workload = None if args.workload == "scenario" else args.workload
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ra-scaling-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.sizes:
        path = folder / f"requests_{n}.duckdb"
        if not (args.reuse and path.exists()) and args.tile_from and n > args.tile_from:
            base = folder / f"requests_{args.tile_from}.duckdb"
            if not base.exists():
                generate(base, args.tile_from, args.batch, args.scenario, workload)
            for p in (path, Path(f"{path}.wal")):
                p.unlink(missing_ok=True)
            g = tile(base, path, n)
            print(f"[{n:>9,} requests] tiled {g['copies']} copies of a {g['base_requests']:,}-request "
                  f"run in {g['tile_s']:.1f} s", flush=True)
        elif not (args.reuse and path.exists()):
            for p in (path, Path(f"{path}.wal")):
                p.unlink(missing_ok=True)
            g = generate(path, n, args.batch, args.scenario, workload)
            print(f"[{n:>9,} requests] generated {g['spans']:,} spans in {g['generate_s']:.1f} s "
                  f"(decode {g['decode_s']:.1f} s, append {g['append_s']:.1f} s)", flush=True)
        m = measure(path, n, args.query_timeout)
        rows.append((n, m))
        print(f"[{n:>9,} requests] rows {m['rows']}  store {m['bytes'] / 2**20:.1f} MiB "
              f"({m['bytes'] / n * 1e6 / 2**30:.2f} GiB per million requests)")
        print(f"  refresh (Store.refresh) {m['store_refresh_s']:.2f} s; "
              f"relation by relation {m['refresh_by_relation_s']:.2f} s")
        total = sum(s for _, _, s in m["relations"]) or 1.0
        for name, kind, s in sorted(m["relations"], key=lambda r: -r[2])[: args.top]:
            print(f"    {name:<40} {kind:<5} {s:7.3f} s  {s / total:6.1%}")
        for name, s in m["queries"].items():
            shown = f"> {args.query_timeout:g} s (interrupted)" if s == float("inf") else f"{s * 1000:9.1f} ms"
            print(f"  query {name:<32} {shown}")
        sys.stdout.flush()
    print("\nsummary: requests | refresh s | s per 10k requests | store MiB | GiB per 1M requests")
    for n, m in rows:
        print(f"  {n:>9,} | {m['store_refresh_s']:8.2f} | {m['store_refresh_s'] / n * 1e4:8.3f} | "
              f"{m['bytes'] / 2**20:8.1f} | {m['bytes'] / n * 1e6 / 2**30:6.2f}")


if __name__ == "__main__":
    main()
