"""examples/least_load_router.py as a real server between a plain httpx client (no routeaudit
client spans) and two live testbed replicas, traced over OTLP into a real collector; the
outcome is read from the ``requests`` mart.

Covered: a plain completion, a streamed one, a client that cancels mid-stream, a backend killed
while the router still holds its prefix affinity (the router answers 502), and a request the
router then sends to the surviving backend; then routeaudit's instrumented client through the same
router, whose spans the router's must nest in on true time (no request ``clock_suspect``).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx

from testbed.live import ServerThread, make_tracer_provider

if TYPE_CHECKING:
    from conftest import Stack  # tests/routers/conftest.py

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "least_load_router.py"
MODEL = "sim-8b"
IDS = ["ex-plain", "ex-stream", "ex-cancel", "ex-killed", "ex-after"]
PROMPT_A = "alpha beta gamma delta " * 8  # affinity: served first, asked again once A is dead
PROMPT_B = "one two three four five " * 8
PROMPT_C = "red green blue yellow " * 8


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("least_load_router", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_router_is_small() -> None:
    """What docs/instrument-your-router.md says of it: under 100 lines, 19 of them routeaudit."""
    lines = EXAMPLE.read_text("utf-8").splitlines()
    marked = [ln for ln in lines if "# routeaudit" in ln and "``" not in ln]
    assert len(lines) < 100 and len(marked) == 19
    assert "19 are routeaudit" in (EXAMPLE.parents[1] / "docs" / "instrument-your-router.md"
                                   ).read_text("utf-8")


def _body(prompt: str, *, stream: bool, max_tokens: int = 6) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


def _rows(stack: Stack) -> dict[str, dict[str, Any]]:
    rows = stack.query(
        "select request_id, status, http_status, failure_source, failure_reason, "
        "chosen_replica, served_by, has_client, has_router, has_replica, policy, router_ttfb_ms, "
        "router_ms "
        "from requests where request_id in (select unnest(?::varchar[]))", [IDS])
    return {r["request_id"]: r for r in rows}


def _settled(rows: dict[str, dict[str, Any]]) -> bool:
    if sorted(rows) != sorted(IDS) or not all(r["has_router"] for r in rows.values()):
        return False
    served = ("ex-plain", "ex-stream", "ex-after")
    return (all(rows[i]["has_replica"] for i in served)
            and rows["ex-cancel"]["status"] == "cancelled"
            and rows["ex-killed"]["status"] == "error")


def test_example_router_end_to_end(stack: Stack) -> None:
    tp = make_tracer_provider("router", "example-router", otlp_endpoint=stack.collector.traces_url,
                              run_id=stack.run_id)
    assert tp is not None
    stack.providers.append(tp)
    a, b = stack.worker_urls
    router = ServerThread(_example().make_app([a, b], tracer_provider=tp), "127.0.0.1",
                          name="example-router").start()
    stack.servers.append(router)
    url = router.url + "/v1/completions"
    with httpx.Client(timeout=30.0) as client:
        plain = client.post(url, json=_body(PROMPT_A, stream=False),
                            headers={"x-request-id": "ex-plain"})
        assert plain.status_code == 200, plain.text
        assert plain.json()["choices"][0]["text"]

        with client.stream("POST", url, json=_body(PROMPT_B, stream=True),
                           headers={"x-request-id": "ex-stream"}) as streamed:
            assert streamed.status_code == 200
            lines = [ln for ln in streamed.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 3

        with client.stream("POST", url, json=_body(PROMPT_C, stream=True, max_tokens=400),
                           headers={"x-request-id": "ex-cancel"}) as cancelled:
            assert cancelled.status_code == 200
            assert next(cancelled.iter_raw())  # one chunk, then the client walks away

        stack.servers[0].stop()  # backend A dies while the router still holds PROMPT_A's affinity
        killed = client.post(url, json=_body(PROMPT_A, stream=False),
                             headers={"x-request-id": "ex-killed"})
        assert killed.status_code == 502, killed.text

        after = client.post(url, json=_body(PROMPT_A, stream=True),
                            headers={"x-request-id": "ex-after"})
        assert after.status_code == 200 and after.text.rstrip().endswith("data: [DONE]")

    # routeaudit's own client too: its spans are the reference clock, and the router's spans must
    # nest inside them on true time, or every request through the router is clock_suspect
    traced = stack.drive(router.url, "ex-client", n=6)
    assert [r.status for r in traced] == ["ok"] * 6, [(r.status, r.error) for r in traced]
    traced_ids = [r.request_id for r in traced]
    assert stack.wait_for_requests(traced_ids) == 6

    stack.flush()
    deadline = time.monotonic() + 15.0
    rows = _rows(stack)
    while not _settled(rows) and time.monotonic() < deadline:
        time.sleep(0.25)
        stack.flush()
        rows = _rows(stack)

    replica_a, replica_b = stack.replica_ids
    assert sorted(rows) == sorted(IDS), rows
    for rid in ("ex-plain", "ex-stream", "ex-after"):
        r = rows[rid]
        assert (r["status"], r["http_status"]) == ("ok", 200), r
        assert r["chosen_replica"] == r["served_by"] is not None, r
        assert not r["has_client"] and r["has_router"] and r["policy"] == "least_load_prefix"
        # the middleware's first-byte mark: within the router's own time
        assert 0 < r["router_ttfb_ms"] <= r["router_ms"], r
    assert rows["ex-plain"]["served_by"] == replica_a  # least load, first of equals
    assert rows["ex-after"]["served_by"] == replica_b  # A is down: the survivor

    cancel = rows["ex-cancel"]
    assert (cancel["status"], cancel["http_status"], cancel["failure_source"]) == (
        "cancelled", 499, "router"), cancel

    killed_row = rows["ex-killed"]
    assert (killed_row["status"], killed_row["http_status"]) == ("error", 502), killed_row
    assert killed_row["failure_source"] == "router" and "502" in killed_row["failure_reason"]
    assert killed_row["chosen_replica"] == replica_a and killed_row["served_by"] is None
    assert not killed_row["has_replica"]

    # router-side spans: the server span holds the router's status and first byte, each forward
    # ended (the killed one with its connection error, the cancelled one as cancelled)
    spans = stack.query(
        "select s.a_request_id as rid, s.name, s.kind, s.status_code, s.a_http_status as http, "
        "v.attributes->>'routeaudit.router.ttfb_ms' as ttfb, "
        "v.attributes->>'error.type' as error_type, "
        "v.attributes->>'routeaudit.misuse' as misuse "
        "from raw_spans as s join raw_span_attributes as v using (trace_id, span_id) "
        "where s.a_component = 'router' and s.a_request_id in (select unnest(?::varchar[]))",
        [IDS])
    server = {s["rid"]: s for s in spans if s["kind"] == "server"}
    forward = {s["rid"]: s for s in spans if s["name"] == "routeaudit.forward"}
    assert sorted(server) == sorted(IDS) and sorted(forward) == sorted(IDS)
    assert all(s["misuse"] is None for s in spans), [s for s in spans if s["misuse"]]
    assert server["ex-stream"]["http"] == 200 and 0 < float(server["ex-stream"]["ttfb"]) < 30_000
    assert server["ex-killed"]["http"] == 502 and server["ex-killed"]["status_code"] == "error"
    assert forward["ex-killed"]["status_code"] == "error"
    assert forward["ex-killed"]["error_type"] in ("ConnectError", "RemoteProtocolError",
                                                   "ReadError", "WriteError", "ConnectTimeout")
    assert forward["ex-cancel"]["error_type"] == "cancelled"
    assert forward["ex-stream"]["status_code"] == "unset" and forward["ex-stream"]["http"] == 200

    clocks = stack.query(
        "select request_id, status, clock_suspect, chosen_replica, served_by from requests "
        "where request_id in (select unnest(?::varchar[]))", [IDS + traced_ids])
    assert len(clocks) == len(IDS) + len(traced_ids)
    assert not [c for c in clocks if c["clock_suspect"]], clocks
    assert all(c["status"] == "ok" and c["chosen_replica"] == c["served_by"] == replica_b
               for c in clocks if c["request_id"] in traced_ids), clocks


def test_example_router_without_middleware_records_a_client_cancel(stack: Stack) -> None:
    """The same router with its ``RouterMiddleware`` taken off: only the decision and forward
    spans (``fwd.astream()``) are left to say that the client went away mid-stream. The request
    is ``cancelled`` (HTTP 499, from the router), not an error; a stream read to the end is ok.
    Without the middleware the router's request ids are its own (it passes none), so the two
    requests are told apart by their ``max_tokens``."""
    tp = make_tracer_provider("router", "example-router-bare",
                              otlp_endpoint=stack.collector.traces_url, run_id=stack.run_id)
    assert tp is not None
    stack.providers.append(tp)
    wrapped = _example().make_app(stack.worker_urls, tracer_provider=tp)
    router = ServerThread(wrapped.app, "127.0.0.1", name="example-router-bare").start()
    stack.servers.append(router)
    url = router.url + "/v1/completions"
    with httpx.Client(timeout=30.0) as client:
        with client.stream("POST", url, json=_body(PROMPT_B, stream=True, max_tokens=6)
                           ) as streamed:
            assert streamed.status_code == 200
            assert streamed.read().rstrip().endswith(b"data: [DONE]")
        with client.stream("POST", url, json=_body(PROMPT_C, stream=True, max_tokens=400)
                           ) as cancelled:
            assert cancelled.status_code == 200
            assert next(cancelled.iter_raw())  # one chunk, then the client walks away

    sql = ("select max_tokens, status, http_status, failure_source, failure_reason, has_router, "
           "has_replica from requests where router_id = 'example-router'")
    deadline = time.monotonic() + 15.0
    while True:
        stack.flush()
        rows = {r["max_tokens"]: r for r in stack.query(sql)}
        if sorted(rows) == [6, 400] and all(r["has_router"] and r["has_replica"]
                                            for r in rows.values()):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.25)
    assert not stack.query("select 1 from raw_spans where kind = 'server' and "
                           "a_component = 'router'")  # no middleware: no server span
    assert (rows[6]["status"], rows[6]["http_status"]) == ("ok", 200), rows[6]
    assert (rows[400]["status"], rows[400]["http_status"], rows[400]["failure_source"]) == (
        "cancelled", 499, "router"), rows[400]
