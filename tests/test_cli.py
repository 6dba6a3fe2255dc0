"""The command line as a user meets it: one-line errors, non-zero exits, no tracebacks."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from audit._store import Store

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "routeaudit", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_help_lists_the_commands() -> None:
    out = run("--help")
    assert out.returncode == 0
    for command in ("collect", "sql", "demo", "attribute", "compare", "dashboard"):
        assert command in out.stdout


@pytest.mark.parametrize("query, message", [
    ("select * from no_such_relation", "no_such_relation does not exist"),
    ("drop table raw_spans", "refused: drop statements are not allowed"),
    ("selec 1", "Parser Error"),
])
def test_sql_errors_are_one_line(store_path: Path, query: str, message: str) -> None:
    Store(store_path).close()
    out = run("sql", "--db", str(store_path), query)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_sql_on_a_missing_store(tmp_path: Path) -> None:
    out = run("sql", "--db", str(tmp_path / "nope.duckdb"), "select 1")
    assert out.returncode == 2 and "no store at" in out.stderr and "Traceback" not in out.stderr


def test_unknown_relation_names_the_known_ones(store_path: Path) -> None:
    Store(store_path).close()
    out = run("sql", "--db", str(store_path), "select * from reqests")
    assert "requests" in out.stderr.split("relations:")[1]


def test_sql_formats(store_path: Path) -> None:
    Store(store_path).close()
    out = run("sql", "--db", str(store_path), "--format", "csv", "select 1 as a, 'x' as b")
    assert out.returncode == 0 and out.stdout.splitlines() == ["a,b", "1,x"]
    out = run("sql", "--db", str(store_path), "--format", "json", "select 2 as a")
    assert out.stdout.strip() == '{"a":2}'


def test_sql_csv_writes_nested_columns_as_json(store_path: Path) -> None:
    Store(store_path).close()
    out = run("sql", "--db", str(store_path), "--format", "csv",
              "select 1 as a, [1, 2] as l, {'k': 'v', 'n': [3]} as s, null::int[] as e")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ['a,l,s,e', '1,"[1,2]","{""k"":""v"",""n"":[3]}",']


def test_sql_refuses_explain_analyze_of_a_write(store_path: Path) -> None:
    Store(store_path).close()
    out = run("sql", "--db", str(store_path), "explain analyze delete from raw_spans")
    assert out.returncode == 2 and "delete statements are not allowed" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_slo_flag_is_a_user_error(store_path: Path) -> None:
    Store(store_path).close()
    out = run("sql", "--db", str(store_path), "--ttft-slo-ms", "-5", "select 1")
    assert out.returncode == 2 and "positive" in out.stderr


def test_dashboard_refuses_a_public_address_without_a_token() -> None:
    out = run("dashboard", "--host", "0.0.0.0")
    assert out.returncode == 2 and "without a token" in out.stderr


def test_collect_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    out = run("collect", "--db", str(tmp_path / "a.duckdb"), "--host", "0.0.0.0")
    assert out.returncode == 2 and "without a token" in out.stderr and "Traceback" not in out.stderr


def test_compare_and_capacity_on_the_sample_data(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from audit._store import Store
    from routeaudit._demo import SAMPLE_DIR

    db = tmp_path / "sample.duckdb"
    store = Store(db)
    store.append(spans=pq.read_table(SAMPLE_DIR / "raw_spans.parquet"),
                 events=pq.read_table(SAMPLE_DIR / "raw_span_events.parquet"))
    store.close()
    import audit

    truth = audit.open(db).query(
        "select run_id, count(*) as n, quantile_cont(ttft_ms, 0.5) as p50 from requests "
        "group by run_id order by run_id").rows(named=True)
    out = run("compare", "--db", str(db), "--baseline", "mixed-round_robin-s0",
              "--candidate", "mixed-qp_cost-s0")
    assert out.returncode == 0, out.stderr
    p50 = next(line for line in out.stdout.splitlines() if line.startswith("TTFT p50"))
    by_run = {r["run_id"]: r for r in truth}
    assert p50.split()[2:4] == [f"{by_run['mixed-round_robin-s0']['p50']:.0f}", "ms"]
    assert "Mann-Whitney" in out.stdout and "timeouts" in out.stdout
    out = run("capacity", "--db", str(db), "--target-qps", "20", "--concurrency", "10")
    assert out.returncode == 0 and "C = 10 (given)" in out.stdout
    out = run("compare", "--db", str(db), "--baseline", "nope", "--candidate", "mixed-qp_cost-s0")
    assert out.returncode == 0 and "no requests for run 'nope'" in out.stdout


def test_attribute_says_when_the_relations_lag(store_path: Path) -> None:
    """A summary read while a collector's rebuild runs behind says so, and by how much."""
    import duckdb
    import pyarrow as pa

    from audit.schema import RAW_SPANS_SCHEMA

    Store(store_path).close()
    out = run("attribute", "--db", str(store_path))
    assert out.returncode == 0 and "note:" not in out.stdout
    span = dict(trace_id="ab" * 16, span_id="0" * 15 + "1", name="s", kind="internal", start_ns=1,
                end_ns=2, status_code="unset", received_ns=3, event_count=0)
    con = duckdb.connect(str(store_path))
    con.register("late", pa.Table.from_pylist([span], schema=RAW_SPANS_SCHEMA))
    con.execute("insert into raw_spans by name select * from late")  # as the writer does
    con.close()
    out = run("attribute", "--db", str(store_path))
    assert out.returncode == 0, out.stderr
    assert "note: Relations rebuilt" in out.stdout
    assert "1 span stored since then is not in them yet" in out.stdout


class _ModelCheckingServer:
    """A real HTTP server that answers like SMG: 400 "missing field `model`" unless the body
    names a model, else a minimal OpenAI completion."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: list[object] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                seen.append(body.get("model"))
                if "model" not in body:
                    status, answer = 400, b"Failed to deserialize the JSON body: missing field `model`"
                else:
                    status, answer = 200, json.dumps({
                        "id": "cmpl-1", "object": "text_completion", "model": body["model"],
                        "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
                    }).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json" if status == 200 else "text/plain")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_testbed_load_sends_the_model_and_names_the_first_failure() -> None:
    server = _ModelCheckingServer()
    try:
        common = ("testbed", "load", "--url", server.url, "--requests", "3", "--stream-fraction", "0",
                  "--time-scale", "0", "--otlp-endpoint", "")
        out = run(*common)
        assert out.returncode == 0, out.stderr
        assert "'error': 3" in out.stdout
        assert "first failure" in out.stdout and "HTTP 400" in out.stdout and "missing field `model`" in out.stdout
        out = run(*common, "--model", "tiny")
        assert out.returncode == 0, out.stderr
        assert "'ok': 3" in out.stdout and "first failure" not in out.stdout
        assert server.seen[-3:] == ["tiny", "tiny", "tiny"]
    finally:
        server.close()


def test_stopping_the_dashboard_stops_its_server(store_path: Path) -> None:
    import os
    import signal

    from collectors.routers import free_port

    Store(store_path).close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "routeaudit", "dashboard", "--db", str(store_path),
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert _until(lambda: _health(port) == 200, 90), "the dashboard did not start"
        proc.send_signal(signal.SIGTERM)  # to routeaudit alone, not its process group
        assert proc.wait(30) == 128 + signal.SIGTERM
        assert _until(lambda: not _listens(port), 30), "Streamlit still listens after the dashboard stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass


def _until(predicate: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def _health(port: int) -> int | None:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status_code
    except httpx.HTTPError:
        return None


def _listens(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_testbed_load_replays_an_own_trace(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:00.0,120,4\n2023-11-16 18:15:00.5,80,3\n2023-11-16 18:15:01.0,60,2\n")
    server = _ModelCheckingServer()
    try:
        out = run("testbed", "load", "--url", server.url, "--trace", str(trace), "--model", "tiny",
                  "--stream-fraction", "0", "--time-scale", "0", "--otlp-endpoint", "")
        assert out.returncode == 0, out.stderr
        assert "3 requests sent: {'ok': 3}" in out.stdout
    finally:
        server.close()
