"""Hostile-input soak: a real collector (``python -m collectors.otlp --spool``) under what an
attacker on its port can send, while genuine senders export through the OpenTelemetry SDK.

Phases, in order:

1. **bypass corpus** through ``POST /routeaudit/query`` (the read-only bypass attempts of
   ``tests/audit/test_readonly.py``, read from its ``BYPASSES`` list, plus a few of its own);
   the store's fingerprint (tables, views, row counts, row hashes) is taken before and after
   each, and a change is a write through a read;
2. **mutated bodies**: real OTLP exports built by the OTel SDK (spans with attributes, events,
   links), serialized as protobuf and as OTLP/JSON, mutated (bit flips, truncation, splices,
   inserted and repeated bytes, random bytes, gzip of a mutant), sent over HTTP and gRPC;
3. **gzip bombs**: waves of concurrent 60 KB bodies that inflate to 63 MiB, over HTTP, and
   gzip-compressed 63 MiB gRPC messages;
4. **slow-loris**: connections that send a header line now and then, never the end, while a
   genuine SDK exporter keeps exporting;
5. **long queries**: a cross join that runs for minutes, its client gone after 2 s;
6. **SIGKILLs** of the collector (with ``--spool``) while genuine senders export; restarted
   each time.

Genuine senders run through phases 2-6; every span of an export the SDK reported SUCCESS is
"acknowledged". At the end the collector is stopped and the store file read directly. Printed:
writes through reads (want 0), 5xx answers (HTTP 500-599 and gRPC INTERNAL / UNKNOWN / DATA_LOSS;
want 0), peak RSS of the collector processes (VmHWM), acknowledged spans and how many of them are
stored (want equal).

    python3 benchmarks/hostile_soak.py                       # about 2-3 minutes
    python3 benchmarks/hostile_soak.py --mutations 100000 --kills 5 --bomb-waves 4   # longer
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import gzip
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402
import grpc  # noqa: E402
import httpx  # noqa: E402
from google.protobuf import json_format  # noqa: E402

from collectors.routers import free_ports  # noqa: E402

QUERY = {"x-routeaudit-query": "1", "content-type": "application/json"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
GRPC_5XX = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
MiB = 1024 * 1024

OWN_BYPASSES = [
    "explain analyze delete from raw_spans", "explain analyze drop table raw_span_events",
    "explain analyze insert into raw_spans select * from raw_spans", "checkpoint",
    "pivot raw_spans on name", "call checkpoint()", "copy raw_spans to 'x.csv'",
    "attach ':memory:' as m", "set threads = 1", "pragma force_checkpoint", "install httpfs",
    "select 1; delete from raw_spans",
]


def bypass_corpus() -> list[str]:
    """``BYPASSES`` of tests/audit/test_readonly.py (read as a literal, nothing imported), then ours."""
    found: list[str] = []
    path = ROOT / "tests" / "audit" / "test_readonly.py"
    if path.exists():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BYPASSES"
                                                     for t in node.targets)):
                found = [s for s in ast.literal_eval(node.value) if isinstance(s, str)]
    return found + [s for s in OWN_BYPASSES if s not in found]


# -- the collector process ------------------------------------------------------------------------
class CollectorProcess:
    """``python -m collectors.otlp`` on fixed ports, restartable after a SIGKILL."""

    def __init__(self, db: Path, flags: list[str]) -> None:
        self.db = db
        self.flags = flags
        self.http_port, self.grpc_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.log = db.with_suffix(".log").open("ab")
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss = 0
        self._sampler_stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collectors.otlp", "--db", str(self.db), "--http-port",
             str(self.http_port), "--grpc-port", str(self.grpc_port), "--spool", *self.flags],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"collector exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("collector did not start")
            time.sleep(0.1)

    def _sample(self) -> None:
        while not self._sampler_stop.wait(0.2):
            proc = self.proc
            if proc is None or proc.poll() is not None:
                continue
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_rss = max(self.peak_rss, int(line.split()[1]) * 1024)
            except OSError:
                pass

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        took = time.monotonic() - t0
        self._sampler_stop.set()
        self.log.close()
        return took


# -- genuine data ---------------------------------------------------------------------------------
def sdk_spans(n: int, seed: int) -> list[Any]:
    """Finished spans of the real SDK: nested, with attributes, events and links."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"soak-{seed}"}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("hostile-soak")
    rng = random.Random(seed)
    for i in range(n):
        with tracer.start_as_current_span("route", attributes={
                "routeaudit.request.id": f"req-{seed}-{i}", "gen_ai.request.model": "m",
                "gen_ai.usage.input_tokens": rng.randint(1, 4000)}) as parent:
            parent.add_event("decision", {"routeaudit.decision.candidates": json.dumps(
                [{"endpoint": f"e{k}", "score": rng.random()} for k in range(3)])})
            link = trace.Link(parent.get_span_context(), {"k": "v"})
            with tracer.start_as_current_span("execute", links=[link]):
                pass
    provider.shutdown()
    return list(mem.get_finished_spans())


def span_keys(spans: list[Any]) -> set[tuple[str, str]]:
    return {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans}


class Senders:
    """Genuine SDK exporters (HTTP and gRPC) exporting until stopped; they record what was
    acknowledged. A failed export (refused, collector killed) is simply not acknowledged."""

    def __init__(self, col: CollectorProcess, threads: int) -> None:
        self.col = col
        self.acked: set[tuple[str, str]] = set()
        self.results: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self, idx: int) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
        from opentelemetry.sdk.trace.export import SpanExportResult

        seed = 1000 * (idx + 1)
        while not self._stop.is_set():
            spans = sdk_spans(10, seed)
            seed += 1
            if idx % 2:
                exporter: Any = Grpc(endpoint=self.col.grpc_target, insecure=True, timeout=5)
            else:
                exporter = Http(endpoint=self.col.url + "/v1/traces", timeout=5)
            try:
                ok = exporter.export(spans) == SpanExportResult.SUCCESS
            except Exception:  # noqa: BLE001 - a killed collector: not acknowledged
                ok = False
            finally:
                exporter.shutdown()
            with self._lock:
                self.results["acknowledged" if ok else "not acknowledged"] += 1
                if ok:
                    self.acked |= span_keys(spans)
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


# -- mutation ---------------------------------------------------------------------------------------
def seed_bodies() -> list[tuple[str, bytes]]:
    """(content type, body) of real exports, protobuf and OTLP/JSON."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    out: list[tuple[str, bytes]] = []
    for seed in range(6):
        msg = encode_spans(sdk_spans(4, 50 + seed))
        out.append(("application/x-protobuf", msg.SerializeToString()))
        out.append(("application/json", json_format.MessageToJson(msg).encode()))
    return out


def mutate(body: bytes, rng: random.Random, seeds: list[tuple[str, bytes]]) -> tuple[bytes, bool]:
    """A mutant of ``body``, and whether to send it gzip-compressed."""
    b = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        if op == 0 and b:  # bit flips
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # truncate
            del b[rng.randrange(len(b)):]
        elif op == 2:  # splice another body in
            other = rng.choice(seeds)[1]
            i, j = rng.randrange(len(b) + 1), rng.randrange(len(other) + 1)
            b[i:] = other[j:]
        elif op == 3:  # insert random bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 32))
        elif op == 4 and b:  # repeat a slice
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randint(1, 200))
            b[i:i] = b[i:j] * rng.randint(2, 20)
        elif op == 5 and b:  # interesting bytes
            i = rng.randrange(len(b))
            b[i] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0xED, 0xA0, ord('"'), ord("\\"), ord("{")])
        elif op == 6:  # varint-ish lengths
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes([0xFF] * rng.randint(1, 10)) + b"\x01"
        elif op == 7:
            b = bytearray(rng.randbytes(rng.randint(0, 300)))
    return bytes(b), rng.random() < 0.1


class Tally:
    """Answers by kind, thread-safe."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.five_xx: Counter[str] = Counter()
        self._lock = threading.Lock()

    def http(self, phase: str, status: int) -> None:
        with self._lock:
            self.counts[f"{phase} http {status}"] += 1
            if 500 <= status <= 599:
                self.five_xx[f"{phase} http {status}"] += 1

    def grpc(self, phase: str, code: grpc.StatusCode) -> None:
        with self._lock:
            self.counts[f"{phase} grpc {code.name}"] += 1
            if code in GRPC_5XX:
                self.five_xx[f"{phase} grpc {code.name}"] += 1

    def other(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1


def grpc_export(channel: grpc.Channel) -> Callable[..., Any]:
    return channel.unary_unary(EXPORT, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def send_mutants(col: CollectorProcess, n: int, tally: Tally, seed: int) -> None:
    seeds = seed_bodies()
    proto_seeds = [s for s in seeds if s[0] == "application/x-protobuf"]

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        with httpx.Client(timeout=30) as client, grpc.insecure_channel(col.grpc_target) as channel:
            export = grpc_export(channel)
            for i in range(k, n, 4):
                over_grpc = i % 2 == 1
                ctype, body = rng.choice(proto_seeds if over_grpc else seeds)
                mutant, gz = mutate(body, rng, seeds)
                if over_grpc:
                    try:
                        export(mutant, timeout=30)
                        tally.grpc("mutants", grpc.StatusCode.OK)
                    except grpc.RpcError as exc:
                        tally.grpc("mutants", exc.code())
                    continue
                headers = {"content-type": ctype}
                if gz:
                    mutant, headers["content-encoding"] = gzip.compress(mutant), "gzip"
                try:
                    tally.http("mutants", client.post(col.url + "/v1/traces", content=mutant,
                                                      headers=headers).status_code)
                except httpx.HTTPError as exc:
                    tally.other(f"mutants http error {type(exc).__name__}")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, range(4)))


# -- the other attacks ---------------------------------------------------------------------------
def fingerprint(col: CollectorProcess) -> str:
    sql = """
        select
            (select string_agg(table_name, ',' order by table_name) from duckdb_tables()) as t,
            (select string_agg(view_name, ',' order by view_name) from duckdb_views()
              where not internal) as v,
            (select count(*) || ':' || coalesce(sum(hash(trace_id, span_id, name)), 0) from raw_spans) as s,
            (select count(*) || ':' || coalesce(sum(hash(trace_id, span_id, name)), 0) from raw_span_events) as e
    """
    r = httpx.post(col.url + "/routeaudit/query", json={"sql": sql}, headers=QUERY, timeout=60)
    if r.status_code != 200:
        raise SystemExit(f"fingerprint query failed: {r.status_code} {r.text}")
    return r.content.hex()


def run_bypasses(col: CollectorProcess, tally: Tally, folder: Path) -> tuple[int, int]:
    """(statements tried, statements after which the store or its folder changed)."""
    writes = 0
    corpus = bypass_corpus()
    files = set(folder.iterdir())
    for sql in corpus:
        before = fingerprint(col)
        try:
            r = httpx.post(col.url + "/routeaudit/query", json={"sql": sql}, headers=QUERY, timeout=60)
            tally.http("bypass", r.status_code)
            if r.status_code == 200:
                tally.other("bypass answered 200 (read-only statement, or a bypass)")
        except httpx.HTTPError as exc:
            tally.other(f"bypass http error {type(exc).__name__}")
        new_files = {p for p in set(folder.iterdir()) - files
                     if ".spool" not in p.name and not p.name.endswith((".wal", ".log", ".tmp"))}
        if fingerprint(col) != before or new_files:
            writes += 1
            print(f"  WRITE THROUGH A READ: {sql!r} {sorted(str(p) for p in new_files)}")
            files |= new_files
    return len(corpus), writes


def run_bombs(col: CollectorProcess, tally: Tally, waves: int) -> None:
    body = gzip.compress(b"\0" * (63 * MiB), compresslevel=9)

    def http_bomb(_: int) -> None:
        try:
            tally.http("bombs", httpx.post(col.url + "/v1/traces", content=body, timeout=120, headers={
                "content-type": "application/x-protobuf", "content-encoding": "gzip"}).status_code)
        except httpx.HTTPError as exc:
            tally.other(f"bombs http error {type(exc).__name__}")

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        for _ in range(waves):
            list(pool.map(http_bomb, range(24)))
    zeros = b"\0" * (63 * MiB)

    def grpc_bomb(_: int) -> None:
        with grpc.insecure_channel(col.grpc_target, compression=grpc.Compression.Gzip,
                                   options=[("grpc.max_send_message_length", 128 * MiB)]) as channel:
            try:
                grpc_export(channel)(zeros, timeout=120)
                tally.grpc("bombs", grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                tally.grpc("bombs", exc.code())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(grpc_bomb, range(8)))


def run_slow_loris(col: CollectorProcess, tally: Tally, connections: int, seconds: float) -> None:
    socks: list[socket.socket] = []
    for _ in range(connections):
        try:
            s = socket.create_connection(("127.0.0.1", col.http_port), timeout=5)
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        except OSError:
            tally.other("slow-loris connect failed")
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        for s in socks:
            try:
                s.sendall(b"X-Slow-%d: 1\r\n" % n)
            except OSError:
                pass
        n += 1
        time.sleep(1.0)
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            closed += s.recv(65536) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    tally.other(f"slow-loris connections closed by the collector: {closed}/{len(socks)}")


def run_long_queries(col: CollectorProcess, tally: Tally, count: int) -> None:
    sql = "select count(*) from range(4000000000) a, range(1000) b"
    for _ in range(count):
        try:
            r = httpx.post(col.url + "/routeaudit/query", json={"sql": sql}, headers=QUERY, timeout=2)
            tally.http("long query", r.status_code)
        except httpx.TimeoutException:
            tally.other("long query: client gave up after 2 s")
    t0 = time.monotonic()
    ok = httpx.get(col.url + "/health", timeout=60).status_code == 200
    tally.other(f"health after long queries: {'ok' if ok else 'NOT OK'} in {time.monotonic() - t0:.1f} s")


def stored_keys(db: Path) -> set[tuple[str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("select trace_id, span_id from raw_spans").fetchall()
    finally:
        con.close()
    return {(str(t), str(s)) for t, s in rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mutations", type=int, default=20_000, help="mutated bodies (half HTTP, half gRPC)")
    p.add_argument("--bomb-waves", type=int, default=2, help="waves of 24 concurrent HTTP gzip bombs")
    p.add_argument("--loris", type=int, default=300, help="slow-loris connections")
    p.add_argument("--loris-seconds", type=float, default=8.0)
    p.add_argument("--long-queries", type=int, default=2)
    p.add_argument("--kills", type=int, default=2, help="SIGKILLs of the collector, with a restart each")
    p.add_argument("--senders", type=int, default=2, help="genuine SDK senders (alternating HTTP, gRPC)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()

    # the SDK exporters log every refused or failed export; the tally counts them instead
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)
    folder = Path(tempfile.mkdtemp(prefix="hostile-soak-"))
    db = folder / "audit.duckdb"
    col = CollectorProcess(db, ["--header-timeout", "2"])
    col.start()
    tally = Tally()
    t_start = time.monotonic()
    print(f"collector {col.url} / {col.grpc_target}; store {db}")

    tried, writes = run_bypasses(col, tally, folder)
    print(f"bypass corpus: {tried} statements, {writes} wrote")

    probe = seed_bodies()[0][1]
    r = httpx.post(col.url + "/v1/traces", content=probe, headers={"content-type": "application/x-protobuf"})
    if r.status_code != 200:
        raise SystemExit(f"a genuine export is refused: {r.status_code} {r.content[:300]!r}")
    senders = Senders(col, a.senders)
    senders.start()
    t0 = time.monotonic()
    send_mutants(col, a.mutations, tally, a.seed)
    print(f"mutants: {a.mutations} in {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    run_bombs(col, tally, a.bomb_waves)
    print(f"bombs: {a.bomb_waves} x 24 HTTP + 8 gRPC in {time.monotonic() - t0:.0f} s")
    run_slow_loris(col, tally, a.loris, a.loris_seconds)
    run_long_queries(col, tally, a.long_queries)
    for _ in range(a.kills):
        time.sleep(2)
        col.kill()
        tally.other("SIGKILL")
        col.start()
    time.sleep(2)
    senders.stop()
    stop_s = col.stop()
    stored = stored_keys(db)
    acked = senders.acked
    lost = acked - stored

    print("\nanswers:")
    for key, n in sorted(tally.counts.items()):
        print(f"  {key:60s} {n:7d}")
    print(f"  genuine exports: {dict(senders.results)}")
    print("\nsummary:")
    print(f"  writes through reads:   {writes}")
    print(f"  5xx answers:            {sum(tally.five_xx.values())} {dict(tally.five_xx) or ''}")
    print(f"  peak RSS:               {col.peak_rss / MiB:.0f} MiB")
    print(f"  acknowledged spans:     {len(acked)}")
    print(f"  of which stored:        {len(acked) - len(lost)}")
    print(f"  stored spans in total:  {len(stored)}")
    print(f"  last stop (SIGTERM):    {stop_s:.1f} s")
    print(f"  run time:               {time.monotonic() - t_start:.0f} s; log {db.with_suffix('.log')}")
    ok = writes == 0 and not tally.five_xx and not lost
    print("  RESULT:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
