"""Ingest fan-out: two collectors behind a trace-id-hash balancer, merged into one store.

Real parts: three ``routeaudit collect`` processes (two behind the balancer, one that receives
every span, the single-collector reference), a balancer of the test's own on a real socket that
splits each OTLP/HTTP export by a hash of the trace id (as the OpenTelemetry Collector's
``loadbalancing`` exporter with ``routing_key: traceID`` does), and spans from the testbed made
by the OpenTelemetry SDK and encoded by its OTLP encoder. For a third of the requests the router
breaks the trace (its decision starts a trace of its own, the replica continues that one): the
client's and the router's sides are then linked only by request id, and land on different
collectors when their trace ids hash apart. ``routeaudit merge`` runs while the collectors run,
and the merged store's relations must equal the reference's.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import audit
import semconv as sc
import testbed
from audit import _relations
from audit._store import Store
from audit.merge import MARKS_TABLE, merge
from collectors.routers import free_port
from testbed import FleetConfig, RouterConfig
from testbed.emit import OTelEmitter

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 90.0
COMPARED = _relations.public_relations()
PROTOBUF = {"content-type": "application/x-protobuf"}


# -- the balancer ----------------------------------------------------------------------------
def collector_of(trace_id: bytes, n: int) -> int:
    """Which of ``n`` collectors a trace goes to."""
    return zlib.crc32(trace_id) % n


def split_by_trace(body: bytes, n: int) -> list[ExportTraceServiceRequest]:
    """One export per collector, each with the spans whose trace hashes to it, under their own
    resource and scope."""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    parts = [ExportTraceServiceRequest() for _ in range(n)]
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                part = parts[collector_of(span.trace_id, n)]
                if not part.resource_spans or part.resource_spans[-1].resource != rs.resource:
                    out_rs = part.resource_spans.add()
                    out_rs.resource.CopyFrom(rs.resource)
                    out_rs.schema_url = rs.schema_url
                out_rs = part.resource_spans[-1]
                if not out_rs.scope_spans or out_rs.scope_spans[-1].scope != ss.scope:
                    out_ss = out_rs.scope_spans.add()
                    out_ss.scope.CopyFrom(ss.scope)
                    out_ss.schema_url = ss.schema_url
                out_rs.scope_spans[-1].spans.add().CopyFrom(span)
    return parts


class Balancer:
    """An OTLP/HTTP proxy: each export is split by trace id and forwarded to the collectors; it
    answers 200 only when every collector did (else the sender retries the whole export, which
    the collectors store once)."""

    def __init__(self, targets: Sequence[str]) -> None:
        self.targets = list(targets)
        self.forwarded = [0] * len(self.targets)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = 200
                for k, part in enumerate(split_by_trace(body, len(outer.targets))):
                    if not part.resource_spans:
                        continue
                    resp = httpx.post(outer.targets[k], content=part.SerializeToString(),
                                      headers=PROTOBUF, timeout=60)
                    if resp.status_code != 200:
                        status = resp.status_code
                        break
                    outer.forwarded[k] += sum(len(ss.spans) for rs in part.resource_spans
                                              for ss in rs.scope_spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the sender: a router that breaks some traces --------------------------------------------
def breaks(trace_id: bytes) -> bool:
    """Whether the router breaks this request's trace (about a third of them)."""
    return zlib.crc32(b"break" + trace_id) % 3 == 0


def router_trace(trace_id: bytes) -> bytes:
    return hashlib.sha256(b"router" + trace_id).digest()[:16]


def break_traces(req: ExportTraceServiceRequest) -> None:
    """For the requests :func:`breaks` picks: the router's decision starts a trace of its own
    and everything beneath it (forward, replica) continues that trace; the client's span keeps
    the original. The two are linked only by the request id both carry."""
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                if span.name == sc.SPAN_CLIENT or not breaks(span.trace_id):
                    continue
                if span.name == sc.SPAN_DECISION:
                    span.parent_span_id = b""
                span.trace_id = router_trace(span.trace_id)


class TeeExporter(SpanExporter):
    """Encodes spans with the SDK's OTLP encoder, lets the router break traces, and posts each
    export to every endpoint (retrying while one answers otherwise than 200)."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = list(endpoints)
        self.spans = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        req = encode_spans(spans)
        break_traces(req)
        body = req.SerializeToString()
        for url in self.endpoints:
            for _ in range(20):
                if httpx.post(url, content=body, headers=PROTOBUF, timeout=60).status_code == 200:
                    break
                time.sleep(0.2)
            else:
                return SpanExportResult.FAILURE
        with self._lock:
            self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


# -- collectors ------------------------------------------------------------------------------
class Collector:
    def __init__(self, db: Path) -> None:
        self.db = db
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "routeaudit", "collect", "--db", str(db), "--http-port",
             str(self.port), "--grpc-port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.proc.stdout.read() if self.proc.stdout else ""
            assert time.monotonic() < deadline, f"collector on {self.db} did not start"
            time.sleep(0.2)

    def health(self) -> dict[str, Any]:
        got: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=10).json()
        return got

    def wait_relations(self) -> None:
        """Until the relations hold every stored span (the collector rebuilds them itself)."""
        deadline = time.monotonic() + WAIT_S
        while (h := self.health())["relations_lag_spans"] != 0:
            assert h["refresh_error"] is None and time.monotonic() < deadline, h
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spans_in(db: Path) -> int:
    return int(audit.open(db).query("select count(*) as n from raw_spans")["n"][0])


def wait_spans(dbs: Sequence[Path], want: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while (got := sum(spans_in(db) for db in dbs)) != want:
        assert got < want and time.monotonic() < deadline, (dbs, got, want)
        time.sleep(0.2)


def emit_run(exporter: SpanExporter, seed: int, n_requests: int, *, batch: bool = True,
             t0_ns: int | None = None) -> None:
    """One testbed run (the ``mixed`` scenario) through ``exporter``."""
    em = OTelEmitter(exporter, batch=batch)
    fleet = None if t0_ns is None else FleetConfig(
        n_replicas=4, router=RouterConfig(policy="qp_cost"), t0_ns=t0_ns)
    testbed.prepare_scenario("mixed", seed=seed, n_requests=n_requests, replicas=4, emitter=em,
                             fleet=fleet).run()
    em.close()
    assert em.errors == 0


def _norm(v: Any) -> Any:
    if isinstance(v, float):
        return None if v != v else round(v, 6)
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _norm(x)) for k, x in v.items()))
    return v


def rows(db: Path, relation: str) -> list[str]:
    got = audit.open(db).query_arrow(f"select * from {relation}").to_pylist()
    return sorted(repr(sorted((k, _norm(v)) for k, v in r.items())) for r in got)


def assert_same_relations(merged: Path, single: Path) -> None:
    for relation in COMPARED:
        a, b = rows(single, relation), rows(merged, relation)
        assert a == b, (f"{relation}: single {len(a)} rows, merged {len(b)}; only single: "
                        f"{sorted(set(a) - set(b))[:2]}; only merged: {sorted(set(b) - set(a))[:2]}")


def assert_linked_once(merged: Path, expect: int) -> None:
    got = audit.open(merged).query(
        "select count(*) as n, count(distinct request_id) as ids, "
        "count(*) filter (where has_client and has_router and has_replica) as whole, "
        "count(*) filter (where link_method = 'request_id') as by_id from requests")
    n, ids, whole, by_id = got.row(0)
    assert n == ids == expect, got
    assert whole == expect, got
    assert by_id > 0, got


def split_requests(a: Path, b: Path) -> int:
    """Requests whose client span is in one store and whose decision is in the other."""
    def sides(db: Path, name: str) -> set[str]:
        return set(audit.open(db).query(
            "select a_request_id as r from raw_spans where name = ?", [name])["r"].to_list())
    return (len(sides(a, sc.SPAN_CLIENT) & sides(b, sc.SPAN_DECISION))
            + len(sides(b, sc.SPAN_CLIENT) & sides(a, sc.SPAN_DECISION)))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[Collector], Collector, Balancer]]:
    behind = [Collector(tmp_path / "a.duckdb"), Collector(tmp_path / "b.duckdb")]
    single = Collector(tmp_path / "single.duckdb")
    balancer: Balancer | None = None
    try:
        for c in (*behind, single):
            c.wait_ready()
        balancer = Balancer([c.url for c in behind])
        yield behind, single, balancer
    finally:
        if balancer is not None:
            balancer.close()
        for c in (*behind, single):
            c.stop()


def test_two_collectors_merged_link_every_request_once(
        fleet: tuple[list[Collector], Collector, Balancer], tmp_path: Path) -> None:
    behind, single, balancer = fleet
    a, b = (c.db for c in behind)
    merged = tmp_path / "merged.duckdb"
    sender = TeeExporter([balancer.url, single.url])

    emit_run(sender, seed=0, n_requests=150)
    wait_spans([a, b], sender.spans)
    wait_spans([single.db], sender.spans)
    assert min(balancer.forwarded) > 0, balancer.forwarded
    split = split_requests(a, b)
    print(f"fan-out: {split} request(s) with client and router on different collectors; "
          f"spans per collector {balancer.forwarded}")
    assert split > 0, "some broken traces must have their sides on both collectors"

    # the collectors keep running: the sources are read through their query endpoints
    assert all(c.proc.poll() is None for c in behind)
    with pytest.raises(audit.StoreError, match="a collector is running on"):
        merge(single.db, [a, b])
    first = merge(merged, [a, b])
    assert first.spans_new == sender.spans
    single.wait_relations()
    assert_linked_once(merged, 150)
    assert_same_relations(merged, single.db)

    # more spans arrive, while merges run: each copies only what is new, none loses a span
    before = sender.spans
    emitting = threading.Thread(target=emit_run, args=(sender, 1, 100))
    emitting.start()
    during = []
    while emitting.is_alive():
        during.append(merge(merged, [a, b], refresh=False))
    emitting.join()
    wait_spans([a, b], sender.spans)
    wait_spans([single.db], sender.spans)
    last = merge(merged, [a, b])
    print("fan-out: merges during emission copied",
          [m.spans_new for m in during], "then", last.spans_new, "of", sender.spans - before)
    assert during, "merges ran while spans arrived"
    assert sum(m.spans_new for m in [*during, last]) == sender.spans - before
    assert spans_in(merged) == sender.spans
    single.wait_relations()
    assert_linked_once(merged, 250)
    assert_same_relations(merged, single.db)
    # nothing new: nothing read, nothing copied
    again = merge(merged, [a, b])
    assert again.spans_new == 0 and sum(s.spans_read for s in again.sources) == 0


# -- offline: late rows, scrapes, duplicates, errors -----------------------------------------
def _batch(spans: pa.Table, received_ns: int) -> pa.Table:
    return spans.set_column(spans.schema.get_field_index("received_ns"), "received_ns",
                            pa.array([received_ns] * spans.num_rows, pa.int64()))


def _events_of(spans: pa.Table, events: pa.Table) -> pa.Table:
    """The rows of ``events`` that belong to ``spans`` (a span's events travel with it)."""
    def key(t: pa.Table) -> Any:
        return pc.binary_join_element_wise(t["trace_id"], t["span_id"], "/")
    return events.filter(pc.is_in(key(events), value_set=key(spans)))


def _testbed_batch(seed: int, n: int, t0_ns: int | None = None) -> tuple[pa.Table, pa.Table]:
    """A testbed run's spans and events as a collector decodes them, traces broken as above."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from collectors.otlp._decode import decode_protobuf

    mem = InMemorySpanExporter()
    emit_run(mem, seed, n, batch=False, t0_ns=t0_ns)
    req = encode_spans(mem.get_finished_spans())
    break_traces(req)
    out = decode_protobuf(req.SerializeToString(), time.time_ns())
    assert out.events is not None
    return out.spans, out.events


def _snapshots(scraped_ns: Sequence[int]) -> pa.Table:
    n = len(scraped_ns)
    return pa.table({"target": ["http://r0:8000/metrics"] * n, "replica": ["r0:8000"] * n,
                     "scraped_ns": pa.array(list(scraped_ns), pa.int64()), "ok": [True] * n,
                     "running": [1.0] * n, "waiting": [0.0] * n, "kv_usage": [0.5] * n,
                     "source": ["replica"] * n})


def test_late_rows_scrapes_and_duplicates_are_merged_once(tmp_path: Path) -> None:
    spans, events = _testbed_batch(seed=3, n=40)
    minute = 60 * 10**9
    now = time.time_ns() // minute * minute
    # two sources sharing a few spans (an export retried to the other collector)
    src_a, src_b = Store(tmp_path / "a.duckdb"), Store(tmp_path / "b.duckdb")
    half = spans.num_rows // 2
    part_a, part_b = spans.slice(0, half + 5), spans.slice(half)
    src_a.append(spans=_batch(part_a, now - 10 * minute), events=_events_of(part_a, events),
                 snapshots=_snapshots([now - 10 * minute + i for i in range(3)]))
    src_b.append(spans=_batch(part_b, now - 9 * minute), events=_events_of(part_b, events))
    src_a.close()
    src_b.close()
    single = Store(tmp_path / "single.duckdb")
    single.append(spans=spans, events=events,
                  snapshots=_snapshots([now - 10 * minute + i for i in range(3)]))
    single.close()

    merged = tmp_path / "merged.duckdb"
    first = merge(merged, [tmp_path / "a.duckdb", tmp_path / "b.duckdb"])
    assert first.spans_new == spans.num_rows and first.snapshots_new == 3
    assert_same_relations(merged, tmp_path / "single.duckdb")
    for table in ("raw_spans", "raw_span_events", "raw_snapshots"):
        q = f"select count(*) as n from {table}"
        assert (audit.open(merged).query(q)["n"][0]
                == audit.open(tmp_path / "single.duckdb").query(q)["n"][0]), table

    # a late span committed with an old receipt time (a spool replayed after a restart), a late
    # scrape in an already merged minute, and the same spans again: only the late rows arrive
    late_spans, late_events = _testbed_batch(seed=4, n=1)
    src_a = Store(tmp_path / "a.duckdb")
    src_a.append(spans=_batch(late_spans, now - 10 * minute + 1), events=late_events,
                 snapshots=_snapshots([now - 10 * minute + 100]))
    src_a.close()
    second = merge(merged, [tmp_path / "a.duckdb", tmp_path / "b.duckdb"])
    assert (second.spans_new, second.snapshots_new) == (late_spans.num_rows, 1)
    assert second.sources[0].buckets_read == 2 and second.sources[1].buckets_read == 0
    events_now = audit.open(merged).query("select count(*) as n from raw_span_events")["n"][0]
    assert events_now == events.num_rows + late_events.num_rows
    con = duckdb.connect(str(merged), read_only=True)
    try:
        marks = con.execute(f"select count(distinct source) from {MARKS_TABLE}").fetchall()[0][0]
    finally:
        con.close()
    assert marks == 2


def test_bad_sources_are_one_line_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.duckdb"
    Store(good).close()
    not_duckdb = tmp_path / "text.duckdb"
    not_duckdb.write_text("hello")
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    cases = [
        ([tmp_path / "missing.duckdb"], "does not exist"),
        ([not_duckdb], "not a DuckDB store"),
        ([other], "not a routeaudit store"),
        ([tmp_path / "merged.duckdb", good], "its own source"),
    ]
    Store(tmp_path / "merged.duckdb").close()
    for sources, message in cases:
        with pytest.raises(audit.StoreError, match=message):
            merge(tmp_path / "merged.duckdb", [good, *sources])
    out = subprocess.run([sys.executable, "-m", "routeaudit", "merge", "--db",
                          str(tmp_path / "m2.duckdb"), str(tmp_path / "missing.duckdb")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0
    assert "does not exist" in out.stderr and not (tmp_path / "m2.duckdb").exists()


SETTINGS = {"partition_s": "60", "window_partitions": "2", "lateness_s": "5", "max_request_s": "120"}
"""Partitions of 60 s: runs laid over half an hour close many of them."""


def _store(path: Path, incremental: bool) -> Store:
    store = Store(path, incremental=incremental)
    store._con.execute("insert or replace into routeaudit_meta select * from (values "
                       + ", ".join(f"('{k}', '{v}')" for k, v in SETTINGS.items()) + ")")
    return store


RUNS = 7
"""Runs of the closed-partitions merge test: enough that partitions close in both sources. A
partition closes once the watermark is a reach (660 s with SETTINGS) past it: over seven runs
five close, so a source whose newest request is minutes older than the other's closes some."""


def test_a_target_without_spans_takes_the_sources_partitioning(tmp_path: Path) -> None:
    """A target created before the merge recorded a new store's partitioning; merged into, it
    takes its sources' and builds its relations under them, refreshing by slices or not."""
    target = tmp_path / "target.duckdb"
    Store(target).close()  # 60 s partitions, a window of 10
    source = _store(tmp_path / "source.duckdb", False)
    try:
        t0 = 1_767_225_600_000_000_000
        for k in range(4):  # more spans than a store refreshes whole
            spans, events = _testbed_batch(seed=40 + k, n=1500, t0_ns=t0 + k * 900 * 10**9)
            source.append(spans=spans, events=events)
        assert source._spans_stored >= 20_000
    finally:
        source.close()
    report = merge(target, [tmp_path / "source.duckdb"])
    # other settings than the relations were built with: every relation is rebuilt
    assert report.refresh_kind == "full"
    store = Store(target)
    try:
        got = store._con.execute("select partition_s, window_partitions, lateness_s, max_request_s "
                                 "from stg_partitioning").fetchall()[0]
        assert tuple(float(v) for v in got) == tuple(float(SETTINGS[k]) for k in (
            "partition_s", "window_partitions", "lateness_s", "max_request_s"))
    finally:
        store.close()


def test_closed_partitions_of_the_sources_are_merged(tmp_path: Path) -> None:
    """Sources refreshed by slices move old partitions to Parquet; the merge reads them too."""
    t0 = 1_767_225_600_000_000_000
    sources = [_store(tmp_path / "a.duckdb", True), _store(tmp_path / "b.duckdb", True)]
    single = _store(tmp_path / "single.duckdb", False)
    try:
        for k in range(RUNS):  # runs of 45 s, three minutes apart
            spans, events = _testbed_batch(seed=10 + k, n=30, t0_ns=t0 + k * 180 * 10**9)
            single.append(spans=spans, events=events)
            side = pa.array([collector_of(bytes.fromhex(t), 2) for t in spans["trace_id"].to_pylist()])
            for n, src in enumerate(sources):
                part = spans.filter(pc.equal(side, n))
                src.append(spans=part, events=_events_of(part, events))
                src.refresh()
        assert all(s.closed_until_ns is not None for s in sources), [
            (s.closed_until_ns, s.last_close_error, s.last_refresh_kind, s.final_until_ns,
             s.newest_request_ns) for s in sources]
        closed = [int(s.query_arrow("select count(*) as n from raw_spans").column("n")[0].as_py())
                  - int(s._con.execute("select count(*) from raw_spans").fetchall()[0][0])
                  for s in sources]
        assert min(closed) > 0, closed  # spans in Parquet, not in the DuckDB tables
    finally:
        for s in (*sources, single):
            s.close()
    merged = tmp_path / "merged.duckdb"
    report = merge(merged, [tmp_path / "a.duckdb", tmp_path / "b.duckdb"])
    assert report.spans_new == spans_in(tmp_path / "single.duckdb")
    assert_same_relations(merged, tmp_path / "single.duckdb")
    again = merge(merged, [tmp_path / "a.duckdb", tmp_path / "b.duckdb"])
    assert again.spans_new == 0

    # a target with closed partitions of its own: a source's spans it holds in Parquet are
    # skipped, the others land, and its refresh by slices gives the single store's relations
    b = spans_in(tmp_path / "b.duckdb")
    into_a = merge(tmp_path / "a.duckdb", [tmp_path / "single.duckdb"])
    assert into_a.spans_new == b
    for table in ("raw_spans", "raw_span_events"):
        q = f"select count(*) as n, count(distinct (trace_id, span_id)) as k from {table}"
        assert (audit.open(tmp_path / "a.duckdb").query(q).rows()
                == audit.open(tmp_path / "single.duckdb").query(q).rows()), table
    assert_linked_once(tmp_path / "a.duckdb", RUNS * 30)
    assert_same_relations(tmp_path / "a.duckdb", tmp_path / "single.duckdb")


# -- the OpenTelemetry Collector configuration in deploy/ ------------------------------------
DEPLOY = ROOT / "deploy" / "otel-collector"


def test_loadbalancing_config_routes_by_trace_id_to_the_documented_collectors() -> None:
    """The otelcol-contrib binary is not installable here: the file's structure is checked, and
    its endpoints against the commands its README and header give."""
    import re

    import yaml

    text = (DEPLOY / "loadbalancing.yaml").read_text()
    cfg = yaml.safe_load(text)
    exporter = cfg["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    otlp = exporter["protocol"]["otlp"]
    assert "endpoint" not in otlp and otlp["tls"]["insecure"] is True
    assert otlp["retry_on_failure"]["enabled"] is True
    hostnames = exporter["resolver"]["static"]["hostnames"]
    assert list(exporter["resolver"]) == ["static"] and len(hostnames) == 2
    pipeline = cfg["service"]["pipelines"]["traces"]
    assert pipeline == {"receivers": ["otlp"], "exporters": ["loadbalancing"]}
    protocols = cfg["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    readme = (DEPLOY / "README.md").read_text()
    for doc in (readme, text):
        started = re.findall(r"routeaudit collect --db (\S+) --grpc-port (\d+) --http-port (\d+)", doc)
        assert [f"127.0.0.1:{grpc}" for _, grpc, _ in started] == hostnames, doc[:200]
        stores = [db for db, _, _ in started]
        assert f"routeaudit merge --db merged.duckdb {' '.join(stores)}" in doc
    # every command line the README shows parses with routeaudit's own parser
    from routeaudit.cli import build_parser

    for line in re.findall(r"^(routeaudit (?:collect|merge) .*?)(?:\s+#.*)?$", readme, re.M):
        build_parser().parse_args(line.split()[1:])


def test_collector_takes_gzip_otlp_grpc_as_the_loadbalancing_exporter_sends(tmp_path: Path) -> None:
    """The exporter speaks OTLP/gRPC with gzip compression by default: a routeaudit collector
    stores such exports (the Python SDK's gRPC exporter, gzip on)."""
    from grpc import Compression
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    from collectors.otlp import Collector as InProcess
    from collectors.otlp import CollectorConfig
    from tests.sdk_spans import finished_spans

    with InProcess(CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0,
                                   grpc_port=0)) as c:
        assert c.grpc_target is not None
        exporter = GrpcExporter(endpoint=c.grpc_target, insecure=True,
                                compression=Compression.Gzip)
        try:
            assert exporter.export(finished_spans(5)) == SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert c._store is not None
        assert c._store.query_arrow("select count(*) as n from raw_spans")["n"][0].as_py() == 5
