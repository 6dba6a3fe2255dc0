"""Backpressure soak: senders offer about twice what the collector can commit, for
``--seconds``, through the real OpenTelemetry SDK OTLP/HTTP exporter (which retries 429 with the
``Retry-After`` delay until its own timeout). Checks, at the end:

* the collector's RSS stayed under ``--rss-limit-mib`` (sampled from /proc every 0.5 s);
* every span of an export the SDK reported SUCCESS is stored, counted by (trace_id, span_id),
  after the collector was SIGKILLed (no drain: acknowledged must already be durable).

    python3 benchmarks/backpressure_soak.py                 # 60 s, 4 senders
    python3 benchmarks/backpressure_soak.py --seconds 20    # quicker

Rate: each sender exports batches of ``--batch`` spans back to back (no pacing), so offered load
is whatever the SDK can produce; the collector commits at most ``--max-group-spans`` spans per
``--commit-delay-ms`` (a deliberately slow store, about 730 spans/s by default), and
``--queue-max-spans`` is small, so the queue fills and 429s happen. The summary prints offered vs
committed spans/s so the overload ratio is visible.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collectors.routers import free_port  # noqa: E402


def sender(url: str, idx: int, seconds: float, batch: int, out: str, q: Any) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": f"soak-{idx}"}))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    tracer = tp.get_tracer("soak")
    exporter = OTLPSpanExporter(endpoint=url, timeout=10)
    offered = acked = failed = 0
    deadline = time.monotonic() + seconds
    with open(out, "w") as ids:
        while time.monotonic() < deadline:
            for i in range(batch):
                with tracer.start_as_current_span("llm_request") as sp:
                    sp.set_attribute("routeaudit.request.id", f"s{idx}-{offered + i}")
                    sp.set_attribute("gen_ai.usage.input_tokens", 100 + i)
                    sp.set_attribute("gen_ai.request.model", "soak")
            spans = mem.get_finished_spans()
            mem.clear()
            offered += len(spans)
            if exporter.export(spans) == SpanExportResult.SUCCESS:
                acked += len(spans)
                ids.writelines(f"{s.context.trace_id:032x},{s.context.span_id:016x}\n" for s in spans)
            else:
                failed += len(spans)
    exporter.shutdown()
    q.put((offered, acked, failed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--queue-max-spans", type=int, default=1024,
                    help="smaller than the senders' exports in flight, so the queue fills")
    ap.add_argument("--rss-limit-mib", type=float, default=1024.0)
    ap.add_argument("--max-group-spans", type=int, default=512,
                    help="spans per commit at most: with --commit-delay-ms this sets the "
                         "collector's sustainable rate")
    ap.add_argument("--commit-delay-ms", type=float, default=700.0,
                    help="sleep before each commit (a slow store), so the senders' offer is "
                         "well above what the collector can commit (0: full speed)")
    args = ap.parse_args()
    import duckdb
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="ra-soak-"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "collectors.otlp", "--db", str(tmp / "a.duckdb"),
                             "--http-port", str(port), "--grpc-port", "-1",
                             "--queue-max-spans", str(args.queue_max_spans),
                             "--max-group-spans", str(args.max_group_spans),
                             "--commit-delay-ms", str(args.commit_delay_ms)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    q: Any = mp.Queue()
    procs = [mp.Process(target=sender, args=(f"http://127.0.0.1:{port}/v1/traces", i, args.seconds,
                                             args.batch, str(tmp / f"ids-{i}.csv"), q))
             for i in range(args.senders)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    peak = 0
    while any(p.is_alive() for p in procs):
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS"):
                peak = max(peak, int(line.split()[1]) * 1024)
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    results = [q.get() for _ in procs]
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()["counters"]
    except httpx.HTTPError:
        health = {}
    proc.kill()
    proc.wait()
    con = duckdb.connect(str(tmp / "a.duckdb"))
    con.execute("create temp table acked (trace_id varchar, span_id varchar)")
    for i in range(args.senders):
        con.execute(f"insert into acked select * from read_csv('{tmp}/ids-{i}.csv', header=false, "
                    "columns={'trace_id': 'varchar', 'span_id': 'varchar'})")
    missing = con.execute("select count(*) from acked a anti join raw_spans r using (trace_id, span_id)").fetchone()[0]
    n_acked = con.execute("select count(*) from acked").fetchone()[0]
    stored = con.execute("select count(*) from raw_spans").fetchone()[0]
    con.close()
    offered = sum(r[0] for r in results)
    failed = sum(r[2] for r in results)
    print(f"soak {args.seconds:.0f} s, {args.senders} SDK senders, queue {args.queue_max_spans} spans")
    capacity = (args.max_group_spans / (args.commit_delay_ms / 1000.0)
                if args.commit_delay_ms > 0 else float("nan"))
    refused = int((health.get("requests") or {}).get("http:429", 0))
    accepted = int((health.get("requests") or {}).get("http:200", 0))
    print(f"  collector capacity (throttled store) about {capacity:,.0f} spans/s")
    print(f"  exports answered 429: {refused:,}; answered 200: {accepted:,} "
          f"(export attempts per acknowledged export: {(refused + accepted) / max(accepted, 1):.2f})")
    print(f"  offered {offered:,} spans, acknowledged {n_acked:,} ({n_acked / wall:,.0f}/s), "
          f"given up by the SDK {failed:,}")
    print(f"  stored {stored:,}; acknowledged but missing: {missing}")
    print(f"  collector peak RSS {peak / 2**20:.0f} MiB (limit {args.rss_limit_mib:.0f})")
    ok = missing == 0 and peak / 2**20 <= args.rss_limit_mib
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
