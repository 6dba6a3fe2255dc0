"""Ingest throughput: stage ceilings, then end to end over real sockets.

Spans are the testbed's (``hot_prefix`` workload through the real OTel SDK: per request a client,
a decision with 8 candidates in one JSON attribute, a forward and a replica span; about 1.5 KB of
protobuf per span, printed at the start),
encoded with the SDK's ``encode_spans`` into requests of ``--batch`` spans.

Stages (one process, CPU seconds, so other load on the machine matters less):
protobuf parse, OTLP/JSON parse (Python) and OTLP/JSON → protobuf bytes (the C transcoder the
receiver runs), decode → Arrow (the Python decoder over upb messages; then the
native decoder straight from the bytes, which is what both receivers run for protobuf bodies),
``Store.append`` per group size.

End to end: ``python -m collectors.otlp`` in its own process; ``--senders`` processes post the
requests (each send gets fresh trace ids, so nothing is a duplicate) for ``--seconds`` over
OTLP/HTTP protobuf, OTLP/HTTP JSON and OTLP/gRPC. A span counts once its export was answered
OK (= committed; with ``--spool`` the clock runs on until the collector reports every
acknowledged span committed); at the end the collector is SIGKILLed and ``count(*)`` of ``raw_spans`` in the
file (after WAL replay) must be at least the acknowledged spans. The collector's peak RSS (VmHWM) is read from /proc;
every 10 s the run also prints its RSS, the spans committed and the background refreshes (count and seconds, from
``/health``), and at the end the collector's warnings (a failed commit or refresh shows there).

    python3 benchmarks/ingest.py                       # stages + 15 s per transport
    python3 benchmarks/ingest.py --seconds 60 --transports http   # the 60 s goal run
    python3 benchmarks/ingest.py --seconds 60 --transports http --spool   # acknowledged at the spool
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collectors.routers import free_ports  # noqa: E402

MARKER = bytes.fromhex("a1b2c3d4e5f6")
"""Every template trace id starts with these 6 bytes; each send replaces them (fresh ids)."""
RUN_MARKER = b"ingest-run-00000000"
"""The templates' run id (in the run and request id attributes); each send replaces it, so
request ids are unique as in a real fleet (a store of one request id repeated hundreds of times
makes every join on it quadratic)."""


def make_templates(n_requests: int, batch: int, cache: Path | None) -> list[bytes]:
    """Serialized ExportTraceServiceRequests of ``batch`` spans with marker-prefixed trace ids
    and the run id replaced by :data:`RUN_MARKER`."""
    if cache is not None and cache.exists():
        cached: list[bytes] = pickle.loads(cache.read_bytes())
        if all(RUN_MARKER in b for b in cached):
            return cached
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import testbed
    from testbed.emit import OTelEmitter

    exp = InMemorySpanExporter()
    em = OTelEmitter(exp, batch=False)
    sim = testbed.prepare_scenario("baseline", n_requests=n_requests, replicas=8, emitter=em,
                                   workload="hot_prefix")
    sim.run()
    spans = list(exp.get_finished_spans())
    em.close()
    bodies = []
    for i in range(0, len(spans) - batch + 1, batch):
        req = encode_spans(spans[i:i + batch])
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    sp.trace_id = MARKER + sp.trace_id[6:]
        # same length, so every length prefix stays valid
        assert len(sim.run_id) == len(RUN_MARKER), sim.run_id
        bodies.append(req.SerializeToString().replace(sim.run_id.encode(), RUN_MARKER))
    if cache is not None:
        cache.write_bytes(pickle.dumps(bodies))
    return bodies


def to_json(body: bytes) -> str:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    doc = json_format.MessageToDict(req)
    # OTLP/JSON encodes ids as hex (protobuf's JSON mapping would give base64).
    import base64

    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
    return json.dumps(doc)


# -- stages -------------------------------------------------------------------------------------
def stages(bodies: list[bytes], batch: int) -> dict[str, float]:
    from collectors.otlp._decode import (
        NATIVE_AVAILABLE,
        decode,
        decode_protobuf,
        json_to_protobuf,
        native_fallbacks,
        parse_json,
        parse_protobuf,
    )

    out: dict[str, float] = {}
    n = batch * len(bodies)
    t = time.process_time()
    reqs = [parse_protobuf(b) for b in bodies]
    out["protobuf parse"] = n / (time.process_time() - t)
    jsons = [to_json(b).encode() for b in bodies[:4]]
    t = time.process_time()
    for j in jsons:
        parse_json(j)
    out["OTLP/JSON parse (json.loads + protobuf constructors)"] = batch * len(jsons) / (time.process_time() - t)
    t = time.process_time()
    for j in jsons:
        json_to_protobuf(j)
    out["OTLP/JSON → protobuf bytes (C transcoder when built)"] = (
        batch * len(jsons) / (time.process_time() - t))
    decode(reqs[0], 1)  # warm up
    t = time.process_time()
    decoded = [decode(r, time.time_ns()) for r in reqs]
    out["decode → Arrow (Python, after parse)"] = n / (time.process_time() - t)
    t = time.process_time()
    for b in bodies[:4]:
        decode(parse_protobuf(b), time.time_ns())
    out["parse + decode (Python path)"] = batch * min(4, len(bodies)) / (time.process_time() - t)
    if NATIVE_AVAILABLE:
        decode_protobuf(bodies[0], 1)  # warm up
        fallbacks = native_fallbacks()
        best = 0.0
        for _ in range(3):  # best of 3: the machine is shared
            t = time.process_time()
            decoded = [decode_protobuf(b, time.time_ns()) for b in bodies]
            best = max(best, n / (time.process_time() - t))
        out["bytes → Arrow (native decoder)"] = best
        if native_fallbacks() != fallbacks:
            print(f"  warning: {native_fallbacks() - fallbacks} bodies fell back to the Python decoder")
    else:
        print("  native decoder not built: collectors/otlp/_native.c (pip install -e . compiles it)")
    # Store.append per group size (fresh trace ids per append: no duplicates).
    import pyarrow as pa
    import pyarrow.compute as pc

    from audit._store import Store

    spans = pa.concat_tables([d.spans for d in decoded])
    events = pa.concat_tables([d.events for d in decoded])
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.duckdb", refresh_interval_s=3600)
        k = 0
        for group in (512, 4096, 16384, 65536):
            reps = max(1, 40_000 // group)
            sub_s = spans.slice(0, group)
            keys = set(zip(sub_s["trace_id"].to_pylist(), sub_s["span_id"].to_pylist(), strict=True))
            mask = [(a, b) in keys
                    for a, b in zip(events["trace_id"].to_pylist(), events["span_id"].to_pylist(), strict=True)]
            sub_e = events.filter(pa.array(mask))
            if sub_s.num_rows < group:
                continue
            elapsed = 0.0
            for _ in range(reps):
                k += 1
                prefix = f"{k:08x}"
                s2 = sub_s.set_column(0, "trace_id", pc.binary_join_element_wise(
                    pa.scalar(prefix), pc.utf8_slice_codeunits(sub_s["trace_id"], 8), ""))
                e2 = sub_e.set_column(0, "trace_id", pc.binary_join_element_wise(
                    pa.scalar(prefix), pc.utf8_slice_codeunits(sub_e["trace_id"], 8), ""))
                t = time.perf_counter()
                store.append(spans=s2, events=e2)
                elapsed += time.perf_counter() - t
            out[f"Store.append, {group} spans/commit"] = group * reps / elapsed
        store._dirty = False
        store.close()
    return out


# -- end to end ---------------------------------------------------------------------------------
def _run_tag(sender: int, seq: int) -> bytes:
    return RUN_MARKER[:-8] + f"{sender:x}{seq:07x}"[-8:].encode()


def _fresh(body: bytes, sender: int, seq: int) -> bytes:
    body = body.replace(MARKER, bytes([0xA0 + sender]) + (seq + 1).to_bytes(5, "big"))
    return body.replace(RUN_MARKER, _run_tag(sender, seq))


def _fresh_json(body: bytes, sender: int, seq: int) -> bytes:
    body = body.replace(MARKER.hex().encode(),
                        (bytes([0xA0 + sender]) + (seq + 1).to_bytes(5, "big")).hex().encode())
    return body.replace(RUN_MARKER, _run_tag(sender, seq))


def sender(transport: str, port: int, bodies: list[bytes], batch: int, idx: int, seconds: float,
           q: Any) -> None:
    acked = refused = seq = 0
    deadline = time.monotonic() + seconds
    if transport == "grpc":
        import grpc

        chan = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = chan.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                request_serializer=None, response_deserializer=None)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        ctype = "application/json" if transport == "json" else "application/x-protobuf"
    while time.monotonic() < deadline:
        body = bodies[seq % len(bodies)]
        data = _fresh_json(body, idx, seq) if transport == "json" else _fresh(body, idx, seq)
        seq += 1
        if transport == "grpc":
            try:
                call(data, timeout=60)
                acked += batch
            except grpc.RpcError:
                refused += 1
                time.sleep(0.2)
            continue
        conn.request("POST", "/v1/traces", data, {"content-type": ctype})
        r = conn.getresponse()
        r.read()
        if r.status == 200:
            acked += batch
        else:
            refused += 1
            time.sleep(0.2)
    q.put((acked, refused, time.process_time()))


def _rss(pid: int) -> tuple[int, int]:
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            vals[k] = int(v.split()[0]) * 1024
    return vals.get("VmRSS", 0), vals.get("VmHWM", 0)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def end_to_end(transport: str, bodies: list[bytes], batch: int, senders: int,
               seconds: float, refresh_interval: float | None = None,
               spool: bool = False, queue_max_spans: int = 200_000,
               memory_limit: str | None = None, extra_args: Sequence[str] = ()) -> dict[str, Any]:
    import httpx

    tmp = tempfile.mkdtemp(prefix="ra-ingest-")
    log = open(f"{tmp}/collector.log", "wb")  # noqa: SIM115 - closed in the finally below
    http_port, grpc_port = free_ports(2)
    proc = subprocess.Popen([sys.executable, "-m", "collectors.otlp", "--db", f"{tmp}/audit.duckdb",
                             "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                             "--queue-max-spans", str(queue_max_spans)]
                            + (["--refresh-interval", str(refresh_interval)] if refresh_interval else [])
                            + (["--spool"] if spool else [])
                            + (["--store-memory-limit", memory_limit] if memory_limit else [])
                            + list(extra_args),
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        payload = [to_json(b).encode() for b in bodies] if transport == "json" else bodies
        q: Any = mp.Queue()
        port = grpc_port if transport == "grpc" else http_port
        procs = [mp.Process(target=sender, args=(transport, port, payload, batch, i, seconds, q))
                 for i in range(senders)]
        cpu0 = _cpu_seconds(proc.pid)  # its start (imports, the store) is not the run's
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        peak_rss = 0
        # every 10 s: RSS (bounded or growing?), spans committed, background refreshes and
        # their seconds (what the relation rebuilds take from ingest), spans not yet in the
        # relations (how far behind readers of the marts are)
        timeline: list[tuple[float, int, int, int, int, int]] = []

        def sample() -> None:
            if timeline and time.perf_counter() - t0 - timeline[-1][0] < 10:
                return
            try:
                h = httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=30).json()
            except httpx.HTTPError:
                h = {}
            c = h.get("counters", {})
            lag = h.get("relations_lag_spans")
            timeline.append((time.perf_counter() - t0, _rss(proc.pid)[0], c.get("spans_committed", -1),
                             c.get("background_refreshes", -1), c.get("background_refresh_seconds", -1),
                             -1 if lag is None else lag))

        while any(p.is_alive() for p in procs):
            peak_rss = max(peak_rss, _rss(proc.pid)[0])
            sample()
            time.sleep(0.5)
        results = [q.get() for _ in procs]
        acked = sum(a for a, _, _ in results)
        refused = sum(r for _, r, _ in results)
        # the load generator runs on the same cores: what it took from the collector
        senders_cpu = sum(c for _, _, c in results)
        # Acknowledged is not yet committed with the spool: the rate counts until the store
        # holds every acknowledged span (the collector's spans_committed counter).
        committed = 0
        while committed < acked:
            try:
                health = httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=30).json()
                committed = health["counters"]["spans_committed"]
            except httpx.HTTPError:
                pass
            if committed < acked:
                sample()
                time.sleep(0.05)
        wall = time.perf_counter() - t0
        hwm = _rss(proc.pid)[1]
        collector_cpu = _cpu_seconds(proc.pid) - cpu0
        fallbacks = None
        try:
            for line in httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=30).text.splitlines():
                if line.startswith("routeaudit_decode_native_fallbacks_total"):
                    fallbacks = int(float(line.split()[-1]))
        except httpx.HTTPError:
            pass
        # Acknowledged = committed: SIGKILL the collector (no drain, no refresh) and count what
        # the file holds after WAL replay. (A query through the collector would first rebuild
        # the relations, which takes longer than the run itself on a busy 2-core machine.)
        proc.kill()
        proc.wait()
        warnings = [line for line in Path(f"{tmp}/collector.log").read_text(errors="replace").splitlines()
                    if " WARNING " in line or " ERROR " in line]
        for line in warnings[:10]:
            print("  collector:", line[:300])
        import duckdb

        con = duckdb.connect(f"{tmp}/audit.duckdb")
        stored = con.execute("select count(*) from raw_spans").fetchone()[0]
        con.close()
        return {"transport": transport, "acked": acked, "refused_requests": refused,
                "stored": stored, "wall_s": wall, "spans_per_s": acked / wall,
                "peak_rss_mib": max(peak_rss, hwm) / 2**20, "native_fallbacks": fallbacks,
                "senders_cpu_s": senders_cpu, "collector_cpu_s": collector_cpu,
                "timeline": [(round(t), round(r / 2**20), c, n, rs, lag)
                             for t, r, c, n, rs, lag in timeline]}
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)  # about 1 GB per run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=512, help="spans per export request")
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0, help="per transport (issue: 60)")
    ap.add_argument("--transports", nargs="*", default=["http", "grpc", "json"],
                    choices=["http", "grpc", "json"])
    ap.add_argument("--requests", type=int, default=1024, help="testbed requests for templates")
    ap.add_argument("--cache", default=None, help="pickle file caching the templates")
    ap.add_argument("--no-stages", action="store_true")
    ap.add_argument("--spool", action="store_true",
                    help="run the collector with --spool (acknowledge at the spool sync)")
    ap.add_argument("--queue-max-spans", type=int, default=200_000,
                    help="the collector's queue bound (its memory under load)")
    ap.add_argument("--refresh-interval", type=float, default=None, metavar="S",
                    help="collector's background relation rebuild interval (default: the "
                         "collector's own, 2 s); a large value measures ingest alone")
    ap.add_argument("--store-memory-limit", default=None, metavar="SIZE",
                    help="collector's DuckDB memory limit (default: the collector's own, 25%%)")
    ap.add_argument("--collector-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for the collector (repeat it: --collector-arg "
                         "--max-group-spans --collector-arg 16384)")
    args = ap.parse_args()
    bodies = make_templates(args.requests, args.batch, Path(args.cache) if args.cache else None)
    print(f"machine: nproc {os.cpu_count()}, load {os.getloadavg()[0]:.1f}; templates: {len(bodies)} "
          f"requests of {args.batch} spans, {sum(map(len, bodies)) / len(bodies) / args.batch:.0f} "
          f"bytes/span (protobuf)")
    if not args.no_stages:
        print("stage ceilings (spans per CPU second, one core):")
        for name, rate in stages(bodies, args.batch).items():
            print(f"  {name:<36} {rate:>10,.0f}")
    for transport in args.transports:
        r = end_to_end(transport, bodies, args.batch, args.senders, args.seconds,
                       args.refresh_interval, args.spool, args.queue_max_spans,
                       args.store_memory_limit, args.collector_arg)
        ok = "OK" if r["stored"] >= r["acked"] else "MISSING SPANS"
        mode = ("spool, " if args.spool else "") + "".join(f"{a} " for a in args.collector_arg)
        print(f"end to end {transport:<5} ({mode}refresh every {args.refresh_interval or 2:g} s) "
              f"{r['spans_per_s']:>9,.0f} spans/s  acked {r['acked']:,} "
              f"stored {r['stored']:,} ({ok})  refused requests {r['refused_requests']}  "
              f"wall {r['wall_s']:.1f} s  collector peak RSS {r['peak_rss_mib']:.0f} MiB  "
              f"native-decoder fallbacks {r['native_fallbacks']}", flush=True)
        print(f"  CPU: collector {r['collector_cpu_s'] / r['wall_s']:.2f} cores, the {args.senders} "
              f"senders {r['senders_cpu_s'] / r['wall_s']:.2f} cores (same machine), of "
              f"{os.cpu_count()}")
        print("  every 10 s: seconds, collector RSS MiB, spans committed, background refreshes "
              "(seconds in them), spans not yet in the relations:")
        for t, m, c, n, rs, lag in r["timeline"]:
            print(f"    {t:4d} s {m:6,d} MiB {c:10,d} committed {n:3d} refreshes ({rs} s) "
                  f"{lag:10,d} behind")


if __name__ == "__main__":
    main()
