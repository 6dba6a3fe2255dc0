"""Failures are failures: a request whose forward failed, timed out or got a 5xx is not ``ok``.

Each case is one routeaudit-instrumented request (``relation_rows.one_request``) with the sides a
real failure leaves: a router whose forward raised (backend killed, so no replica span) and no
client span, a forward that read a 502, a forward that timed out, a replica that answered 500,
a router that answered 502 itself. ``requests`` must say ``error`` / ``timeout`` with the side
that saw it and why, ``slo_summary`` must count it apart from slow requests, and so must
``routeaudit attribute``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from relation_rows import MS, T0, RawRows, one_request, query

import semconv
from audit import SLO
from audit import open as open_store
from audit._store import Store

ROOT = Path(__file__).resolve().parents[2]
_ROUTER = {semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: "r1"}
_REPLICA_URL = "http://127.0.0.1:18001/v1/chat/completions"


def _span_id(short: str) -> str:
    return short.rjust(16, "0")


def _drop(rows: RawRows, n: int, *names: str) -> None:
    """Remove request ``n``'s spans of these names (the sides that never reported)."""
    trace_id = f"{n:x}a".rjust(32, "0")
    rows.spans[:] = [s for s in rows.spans if s["trace_id"] != trace_id or s["name"] not in names]


def _replace_forward(
    rows: RawRows,
    n: int,
    *,
    status_code: str,
    message: str | None = None,
    http_status: int | None = None,
    ms: int = 3,
) -> None:
    """Swap one_request's forward span for one that ended as a failed forward does."""
    forward_id = _span_id(f"{n:x}f")
    old = next(s for s in rows.spans if s["span_id"] == forward_id)
    rows.spans.remove(old)
    attrs: dict[str, Any] = {semconv.COMPONENT: "router", semconv.URL_FULL: _REPLICA_URL}
    if http_status is not None:
        attrs[semconv.HTTP_STATUS] = http_status
    rows.span(
        f"{n:x}a", f"{n:x}f", f"{n:x}d", semconv.SPAN_FORWARD, kind="client",
        start_ns=old["start_ns"], end_ns=old["start_ns"] + ms * MS, attrs=attrs,
        resource=_ROUTER, status_code=status_code,
    )
    rows.spans[-1]["status_message"] = message


def _refused(rows: RawRows, n: int) -> None:
    """Backend killed: the forward raised, the router answered 502 without recording it."""
    one_request(rows, n=n, base_ns=T0 + n * 10_000 * MS)
    _drop(rows, n, semconv.SPAN_CLIENT, semconv.SPAN_VLLM_REQUEST)
    _replace_forward(rows, n, status_code="error",
                     message="ConnectError: [Errno 111] Connection refused")


def _bad_gateway(rows: RawRows, n: int) -> None:
    """The forward read a 502 from whatever sat in front of the replica."""
    one_request(rows, n=n, base_ns=T0 + n * 10_000 * MS)
    _drop(rows, n, semconv.SPAN_CLIENT, semconv.SPAN_VLLM_REQUEST)
    _replace_forward(rows, n, status_code="error", http_status=502)


def _timed_out(rows: RawRows, n: int) -> None:
    one_request(rows, n=n, base_ns=T0 + n * 10_000 * MS)
    _drop(rows, n, semconv.SPAN_CLIENT, semconv.SPAN_VLLM_REQUEST)
    _replace_forward(rows, n, status_code="error", message="ReadTimeout: timed out", ms=30_000)


def _replica_500(rows: RawRows, n: int) -> None:
    """The replica's own span says 500 (routeaudit's replica middleware); the router recorded
    nothing about the answer."""
    b = T0 + n * 10_000 * MS
    one_request(rows, n=n, base_ns=b)
    _drop(rows, n, semconv.SPAN_CLIENT, semconv.SPAN_VLLM_REQUEST)
    _replace_forward(rows, n, status_code="unset", ms=14)
    rows.span(
        f"{n:x}a", f"{n:x}e", f"{n:x}f", semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=b + 10 * MS, end_ns=b + 20 * MS, status_code="error",
        attrs={semconv.COMPONENT: "replica", semconv.GEN_AI_REQUEST_ID: f"chatcmpl-req-{n}",
               semconv.HTTP_STATUS: 500, semconv.REPLICA_ID: "127.0.0.1:18001"},
        resource={semconv.HOST_NAME: "replica-host"},
    )


def _router_answered_502(rows: RawRows, n: int) -> None:
    """The router's own server span carries the 502 it answered."""
    b = T0 + n * 10_000 * MS
    _refused(rows, n)
    rows.span(
        f"{n:x}a", f"{n:x}c", None, "POST /v1/chat/completions", kind="server",
        start_ns=b + 4 * MS, end_ns=b + 20 * MS, status_code="error",
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: f"req-{n}",
               semconv.HTTP_METHOD: "POST", semconv.HTTP_STATUS: 502},
        resource=_ROUTER,
    )


def _client_saw_ok(rows: RawRows, n: int) -> None:
    """The client declared ok: what it got stands, whatever a router span says."""
    one_request(rows, n=n, base_ns=T0 + n * 10_000 * MS)
    _replace_forward(rows, n, status_code="error", message="ReadError: connection reset")


def _retried(rows: RawRows, n: int) -> None:
    """The first forward was refused, the retry went through: the request succeeded. The router
    numbers both decisions attempt 0, so the later decision must be the final one."""
    b = T0 + n * 10_000 * MS
    one_request(rows, n=n, base_ns=b)
    _drop(rows, n, semconv.SPAN_CLIENT)
    t = f"{n:x}a"
    rows.span(
        t, f"{n:x}c", None, "POST /v1/chat/completions", kind="server",
        start_ns=b, end_ns=b + 996 * MS,
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: f"req-{n}",
               semconv.HTTP_METHOD: "POST", semconv.HTTP_STATUS: 200},
        resource=_ROUTER,
    )
    rows.span(
        t, f"{n:x}0d", f"{n:x}c", semconv.SPAN_DECISION, start_ns=b + 1 * MS, end_ns=b + 2 * MS,
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: f"req-{n}",
               semconv.ATTEMPT: 0, semconv.DECISION_CHOSEN: "127.0.0.1:18002",
               semconv.DECISION_OUTCOME: "routed"},
        resource=_ROUTER,
    )
    rows.span(
        t, f"{n:x}0f", f"{n:x}0d", semconv.SPAN_FORWARD, kind="client",
        start_ns=b + 2 * MS, end_ns=b + 3 * MS, status_code="error",
        attrs={semconv.COMPONENT: "router", semconv.URL_FULL: "http://127.0.0.1:18002"},
        resource=_ROUTER,
    )
    rows.spans[-1]["status_message"] = "ConnectError: [Errno 111] Connection refused"


CASES: dict[str, tuple[Callable[[RawRows, int], None], str, str | None, str | None, int | None]] = {
    "forward_refused": (_refused, "error", "router", "ConnectError", None),
    "forward_502": (_bad_gateway, "error", "router", "502", 502),
    "forward_timeout": (_timed_out, "timeout", "router", "ReadTimeout", None),
    "replica_500": (_replica_500, "error", "replica", "500", None),
    "router_answered_502": (_router_answered_502, "error", "router", "502", 502),
    "client_saw_ok": (_client_saw_ok, "ok", None, None, 200),
    "retried": (_retried, "ok", None, None, 200),
}
"""case -> (builder, status, failure_source, text in failure_reason, http_status)."""


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    rows = RawRows()
    for n, (build, *_) in enumerate(CASES.values(), start=1):
        build(rows, n)
    store = Store(tmp_path_factory.mktemp("failures") / "failures.duckdb")
    try:
        spans, events = rows.tables()
        store.append(spans=spans, events=events)
        got = query(store, "select * from requests order by request_id")
    finally:
        store.close()
    by_id = {r["request_id"]: r for r in got.iter_rows(named=True)}
    assert got.height == len(CASES) == len(by_id)
    return {name: by_id[f"req-{n}"] for n, name in enumerate(CASES, start=1)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_side_failure_makes_the_request_fail(
    failures: dict[str, dict[str, Any]], case: str
) -> None:
    _, status, source, reason, http_status = CASES[case]
    row = failures[case]
    assert row["status"] == status, row
    assert row["failure_source"] == source, row
    if reason is None:
        assert row["failure_reason"] is None
    else:
        assert reason in row["failure_reason"]
    assert row["http_status"] == http_status


def test_a_killed_backend_is_an_error_not_a_slow_request(tmp_path: Path) -> None:
    """slo_summary and ``routeaudit attribute`` count the refused forward as an error, apart
    from a slow request of the same run."""
    rows = RawRows()
    one_request(rows, n=1, base_ns=T0)  # ok, TTFT 200 ms: slow against a 100 ms target
    _refused(rows, 2)
    db = tmp_path / "killed.duckdb"
    store = Store(db)
    try:
        spans, events = rows.tables()
        store.append(spans=spans, events=events)
    finally:
        store.close()

    summary = open_store(db, slo=SLO(ttft_ms=100, tpot_ms=1000)).query(
        "select run_id, requests, ok, slow, errors, timeouts, router_failures "
        "from slo_summary order by run_id"
    ).to_dicts()
    assert summary == [
        {"run_id": "run-1", "requests": 1, "ok": 1, "slow": 1, "errors": 0, "timeouts": 0,
         "router_failures": 0},
        {"run_id": None, "requests": 1, "ok": 0, "slow": 0, "errors": 1, "timeouts": 0,
         "router_failures": 1},
    ]

    out = subprocess.run(
        [sys.executable, "-m", "routeaudit", "attribute", "--db", str(db),
         "--ttft-slo-ms", "100", "--tpot-slo-ms", "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    no_run = lines.index(next(x for x in lines if x.startswith("run (no run):")))
    assert "1 requests, 0 ok, 0 slow" in lines[no_run]
    assert "1 error" in lines[no_run + 1] and "0 timeout" in lines[no_run + 1]
    assert lines[no_run + 1].endswith("(seen by router 1)")
    run_1 = lines.index(next(x for x in lines if x.startswith("run run-1:")))
    assert "1 requests, 1 ok, 1 slow" in lines[run_1]
    assert lines[run_1 + 1].endswith("0 error, 0 cancelled")
