"""`routeaudit collect` and `routeaudit sql` as two processes on one store, as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import semconv as sc
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "routeaudit", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def collector(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    db = tmp_path / "live.duckdb"
    port = free_port()
    extra = list(getattr(request, "param", ()))  # e.g. ("--spool",) through indirect parametrize
    proc = subprocess.Popen(
        [sys.executable, "-m", "routeaudit", "collect", "--db", str(db), "--http-port", str(port),
         "--grpc-port", "0", *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        yield db, port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _send_request(port: int, request_id: str) -> None:
    """A client, a router decision and a replica span for one request, over OTLP/HTTP."""
    def provider(name: str) -> TracerProvider:
        tp = TracerProvider(resource=Resource.create({sc.SERVICE_NAME: name, sc.HOST_NAME: "h1"}))
        tp.add_span_processor(SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
        return tp

    from opentelemetry import trace

    client, router, replica = provider("client"), provider("router"), provider("replica")
    with client.get_tracer("t").start_as_current_span(
            sc.SPAN_CLIENT, kind=trace.SpanKind.CLIENT,
            attributes={sc.COMPONENT: "client", sc.REQUEST_ID: request_id,
                        sc.CLIENT_TTFT_MS: 120.0, sc.STATUS: "ok"}):
        with router.get_tracer("t").start_as_current_span(
                sc.SPAN_DECISION, attributes={sc.COMPONENT: "router", sc.REQUEST_ID: request_id,
                                              sc.DECISION_CHOSEN: "127.0.0.1:9001"}):
            with replica.get_tracer("t").start_as_current_span(
                    sc.SPAN_VLLM_REQUEST, kind=trace.SpanKind.SERVER,
                    attributes={sc.GEN_AI_REQUEST_ID: f"cmpl-{request_id}-0",
                                sc.REPLICA_ID: "127.0.0.1:9001", sc.USAGE_PROMPT_TOKENS: 64}):
                pass
    for tp in (client, router, replica):
        tp.shutdown()


def _poll(db: Path, sql: str, want: list[str], within_s: float) -> float:
    """Run `routeaudit sql` until it prints ``want``; return how long that took."""
    started = time.monotonic()
    while True:
        out = _cli("sql", "--db", str(db), "--format", "csv", sql)
        assert out.returncode == 0, out.stderr  # never a lock error
        if out.stdout.splitlines() == want:
            return time.monotonic() - started
        assert time.monotonic() - started < within_s, (out.stdout, want)
        time.sleep(0.3)


@pytest.mark.parametrize("collector", [(), ("--spool",)], indirect=True, ids=["commit", "spool"])
def test_sql_reads_while_collect_writes(collector) -> None:  # type: ignore[no-untyped-def]
    db, port, proc = collector
    sidecar = Path(f"{db}.collector.json")
    assert sidecar.exists() and oct(os.stat(sidecar).st_mode & 0o777) == "0o600"
    spooled = "--spool" in proc.args
    assert Path(f"{db}.spool").is_dir() == spooled
    _send_request(port, "cli-req-1")
    if spooled:  # acknowledged at the spool sync: committed a moment later
        _poll(db, "select count(*) as n from raw_spans", ["n", "3"], within_s=20)
    # Acknowledged spans are committed: the raw table shows them at once ...
    out = _cli("sql", "--db", str(db), "--format", "csv", "select count(*) as n from raw_spans")
    assert out.stdout.splitlines() == ["n", "3"], out.stderr
    # ... and the relations within a few seconds (refresh interval plus one refresh).
    _poll(db, "select request_id, has_client, has_router, has_replica from requests",
          ["request_id,has_client,has_router,has_replica", "cli-req-1,true,true,true"],
          within_s=20)
    _send_request(port, "cli-req-2")
    _poll(db, "select count(*) as n from requests", ["n", "2"], within_s=20)
    assert proc.poll() is None
    # Writes are refused through the collector too.
    out = _cli("sql", "--db", str(db), "delete from raw_spans")
    assert out.returncode == 2 and "refused" in out.stderr


def test_second_collector_on_the_same_store_is_refused(collector) -> None:  # type: ignore[no-untyped-def]
    db, _, _ = collector
    out = subprocess.run(
        [sys.executable, "-m", "routeaudit", "collect", "--db", str(db), "--http-port",
         str(free_port()), "--grpc-port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0


def test_port_in_use_is_a_one_line_error(collector, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, port, _ = collector
    out = _cli("collect", "--db", str(tmp_path / "other.duckdb"), "--http-port", str(port),
               "--grpc-port", "0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(port) in out.stderr


@pytest.mark.parametrize("collector", [("--store-threads", "1", "--refresh-interval", "7",
                                        "--queue-max-spans", "4096")], indirect=True)
def test_collect_takes_the_tuning_flags(collector) -> None:  # type: ignore[no-untyped-def]
    """The flags docs/operations.md names reach the running collector."""
    db, port, _ = collector
    health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
    assert health["queue_limit_spans"] == 4096
    # refreshes start 7 s apart: the pause is what the last refresh (under a second here) left
    # of the interval, more than the default interval (2 s) could give
    assert 3000.0 < health["refresh_gap_ms"] <= 7000.0
    out = _cli("sql", "--db", str(db), "--format", "csv", "select current_setting('threads') as t")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["t", "1"]


def test_a_bad_tuning_flag_is_a_user_error(tmp_path: Path) -> None:
    out = _cli("collect", "--db", str(tmp_path / "a.duckdb"), "--store-threads", "0")
    assert out.returncode == 2 and "store_threads must be a positive integer" in out.stderr
    assert "Traceback" not in out.stderr
