"""A real browser against the collector's query endpoint: a page on another origin (cross-site
request forgery) and a page under a rebound DNS name (DNS rebinding) try to run a write through
``POST /routeaudit/query``; each attempt reaches the collector and is refused before any SQL
runs, and the store is unchanged. An allowed origin, for contrast, can query.

Needs Debian's chromium at /usr/bin/chromium (``make setup-test``); playwright drives it.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from sdk_spans import finished_spans

from collectors.otlp import Collector, CollectorConfig

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ATTACK_SQL = "explain analyze delete from raw_spans"
QUERY = {"x-routeaudit-query": "1"}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="Debian chromium not installed at /usr/bin/chromium (make setup-test)"),
]


def _spans_body(n: int) -> bytes:
    return encode_spans(finished_spans(n, "browser-test")).SerializeToString()


def _fingerprint(c: Collector) -> list[dict[str, Any]]:
    """What a write would change: the tables, and each span's identity."""
    sql = ("select (select list(table_name order by table_name) from duckdb_tables()) as tables, "
           "count(*) as n, sum(hash(trace_id, span_id, name)) as h from raw_spans")
    r = httpx.post(c.query_url, json={"sql": sql}, headers=QUERY)
    assert r.status_code == 200, r.text
    return pa.ipc.open_stream(r.content).read_all().to_pylist()


def _query_statuses(c: Collector) -> dict[str, int]:
    return {k: v for k, v in c.metrics.snapshot()["requests"].items() if k.startswith("query:")}


class _Page(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def page_server() -> Iterator[tuple[str, type[_Page]]]:
    """An attacker's page on its own port of 127.0.0.1 (another origin than the collector)."""
    handler = type("Page", (_Page,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _attack_page(query_url: str) -> bytes:
    body = json.dumps({"sql": ATTACK_SQL})
    # A text/plain form whose single field spells the JSON body: name + "=" + value.
    field_name, field_value = body[:-2] + ', "x": "', '"}'
    return f"""<!doctype html><html><body>
<form id="plain" method="POST" action="{query_url}" enctype="text/plain" target="sink1">
  <input type="hidden" name='{field_name}' value='{field_value}'></form>
<form id="urlenc" method="POST" action="{query_url}" target="sink2">
  <input type="hidden" name="sql" value="{ATTACK_SQL}"></form>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe>
<script>
window.results = {{}};
async function attempt(name, init) {{
  try {{
    const r = await fetch({json.dumps(query_url)}, init);
    window.results[name] = "status " + r.status + " type " + r.type;
  }} catch (e) {{
    window.results[name] = "error " + e.name;
  }}
}}
window.run = async () => {{
  await attempt("simple", {{method: "POST", mode: "no-cors", body: {json.dumps(body)},
                            headers: {{"content-type": "text/plain"}}}});
  await attempt("preflighted", {{method: "POST", body: {json.dumps(body)},
                                 headers: {{"content-type": "application/json",
                                           "x-routeaudit-query": "1"}}}});
  document.getElementById("plain").submit();
  document.getElementById("urlenc").submit();
  return window.results;
}};
</script></body></html>""".encode()


def _launch(pw: Any, *args: str) -> Any:
    return pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS + list(args))


def _wait_for(c: Collector, want: int, timeout_ms: int, page: Any) -> dict[str, int]:
    """Poll until the collector answered ``want`` more refusals (the forms post asynchronously)."""
    for _ in range(timeout_ms // 100):
        statuses = _query_statuses(c)
        if statuses.get("query:403", 0) >= want:
            return statuses
        page.wait_for_timeout(100)
    return _query_statuses(c)


def test_cross_origin_page_cannot_query(tmp_path: Path, page_server: tuple[str, type[_Page]]) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    origin, handler = page_server
    cfg = CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=None)
    with Collector(cfg) as c:
        assert httpx.post(c.traces_url, content=_spans_body(5),
                          headers={"content-type": "application/x-protobuf"}).status_code == 200
        before = _fingerprint(c)
        assert before[0]["n"] == 5
        handler.html = _attack_page(c.query_url)
        statuses_before = _query_statuses(c)
        with sync_api.sync_playwright() as pw:
            browser = _launch(pw)
            try:
                page = browser.new_page()
                page.goto(origin + "/")
                results = page.evaluate("window.run()")
                # simple fetch (opaque answer), preflight (refused, so the POST never leaves),
                # and both forms: four requests, each refused at the Origin check.
                statuses = _wait_for(c, statuses_before.get("query:403", 0) + 4, 15_000, page)
            finally:
                browser.close()
        assert results["simple"] == "status 0 type opaque", results
        assert results["preflighted"] == "error TypeError", results
        assert statuses.get("query:403", 0) - statuses_before.get("query:403", 0) == 4, statuses
        # nothing got as far as the SQL: no answer from the read-only check, no result
        assert statuses.get("query:400", 0) == statuses_before.get("query:400", 0)
        assert statuses.get("query:200", 0) == statuses_before.get("query:200", 0) + 0
        assert _fingerprint(c) == before


def test_rebound_dns_name_cannot_query(tmp_path: Path) -> None:
    """The attacker's name resolves to the collector's address: the page is same-origin with the
    port, so no CORS applies; the Host header (the attacker's name) is what gives it away."""
    sync_api = pytest.importorskip("playwright.sync_api")
    cfg = CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=None)
    with Collector(cfg) as c:
        assert httpx.post(c.traces_url, content=_spans_body(3),
                          headers={"content-type": "application/x-protobuf"}).status_code == 200
        before = _fingerprint(c)
        rebound = f"http://rebind.attacker.test:{c.http_port}"
        script = f"""async () => {{
          const out = {{}};
          let r = await fetch("/health");
          out.health = r.status;
          r = await fetch("/routeaudit/query", {{method: "POST",
              headers: {{"content-type": "application/json", "x-routeaudit-query": "1"}},
              body: {json.dumps(json.dumps({"sql": ATTACK_SQL}))}}});
          out.query = r.status;
          r = await fetch("/v1/traces", {{method: "POST",
              headers: {{"content-type": "application/json"}}, body: "{{}}"}});
          out.traces = r.status;
          return out;
        }}"""
        with sync_api.sync_playwright() as pw:
            # Chromium's own defence (Private/Local Network Access: a public page may not reach
            # a loopback address) is turned off: other browsers, and older ones, lack it.
            browser = _launch(pw, "--host-resolver-rules=MAP rebind.attacker.test 127.0.0.1",
                              "--disable-features=BlockInsecurePrivateNetworkRequests,"
                              "PrivateNetworkAccessSendPreflights,"
                              "PrivateNetworkAccessRespectPreflightResults,LocalNetworkAccessChecks")
            try:
                page = browser.new_page()
                # The attacker's page, as served before the name was re-pointed.
                page.route(rebound + "/", lambda route: route.fulfill(
                    status=200, content_type="text/html", body="<!doctype html><p>hi</p>"))
                page.goto(rebound + "/")
                out = page.evaluate(script)
            finally:
                browser.close()
        # Same-origin, so the page reads each answer: all refused.
        assert out == {"health": 403, "query": 403, "traces": 403}, out
        assert _fingerprint(c) == before


def test_allowed_origin_can_query(tmp_path: Path, page_server: tuple[str, type[_Page]]) -> None:
    """The preflight and the query succeed for an origin on --allow-origin (so the refusals above
    are the checks at work, not a page that could not have worked anyway)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    origin, handler = page_server
    cfg = CollectorConfig(db_path=tmp_path / "audit.duckdb", http_port=0, grpc_port=None,
                          allowed_origins=(origin,))
    with Collector(cfg) as c:
        handler.html = b"<!doctype html><p>dashboard</p>"
        script = f"""async () => {{
          const r = await fetch({json.dumps(c.query_url)}, {{method: "POST",
              headers: {{"content-type": "application/json", "x-routeaudit-query": "1"}},
              body: JSON.stringify({{sql: "select 41 + 1 as x"}})}});
          return [r.status, r.headers.get("content-type"), (await r.arrayBuffer()).byteLength];
        }}"""
        with sync_api.sync_playwright() as pw:
            browser = _launch(pw)
            try:
                page = browser.new_page()
                page.goto(origin + "/")
                status, ctype, size = page.evaluate(script)
            finally:
                browser.close()
        assert (status, ctype) == (200, "application/vnd.apache.arrow.stream") and size > 0
