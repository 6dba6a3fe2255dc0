"""The dashboard's questions answered from router and replica spans alone, as for a fleet whose
clients are not instrumented: time windows, goodput, the slow list and the request picker."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

import audit
import semconv
from audit import SLO, Store, queries

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit"))
from relation_rows import MS, T0, RawRows, one_request  # noqa: E402


@pytest.fixture(scope="module")
def server_only_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = RawRows()
    for n in range(1, 22):
        one_request(rows, n=n, base_ns=T0 + n * 3000 * MS)
    # req-21: the backend was killed: the forward raised, no replica span
    failed = f"{21:x}a".rjust(32, "0")
    rows.spans[:] = [s for s in rows.spans
                     if s["trace_id"] != failed or s["name"] != semconv.SPAN_VLLM_REQUEST]
    forward = next(s for s in rows.spans if s["trace_id"] == failed and s["name"] == semconv.SPAN_FORWARD)
    forward["status_code"] = "error"
    forward["status_message"] = "ConnectError: [Errno 111] Connection refused"
    # two router policies, and no run id anywhere (the client spans carried it)
    for span in rows.spans:
        if span["name"] == semconv.SPAN_DECISION and int(span["trace_id"][:-1], 16) % 2 == 0:
            span["a_policy"] = "least_load"
    spans, events = rows.tables()
    keep = pc.not_equal(spans["name"], semconv.SPAN_CLIENT)
    path = tmp_path_factory.mktemp("server-only") / "audit.duckdb"
    store = Store(path)
    store.append(spans=spans.filter(keep), events=events)
    store.close()
    return path


@pytest.fixture(scope="module")
def server_only(server_only_path: Path) -> audit.Reader:
    return audit.open(server_only_path)


def test_requests_have_a_start_without_a_client(server_only: audit.Reader) -> None:
    got = server_only.query("select count(*) as n, count(client_start) as clients, "
                            "count(first_seen_at) as started from requests").row(0, named=True)
    assert got == {"n": 21, "clients": 0, "started": 21}


def test_overview_window_and_time_series(server_only: audit.Reader) -> None:
    totals = queries.overview_totals(server_only).row(0, named=True)
    assert totals["requests"] == 21 and totals["failed"] == 1
    assert totals["window_s"] == pytest.approx(20 * 3.0, rel=0.01)  # first to last start, not 1 ms
    assert totals["goodput_rps"] < 1.0
    series = queries.requests_over_time(server_only)
    assert series.height > 1 and series["requests"].sum() == 21


def test_slow_page_and_request_picker(server_only: audit.Reader) -> None:
    opts = queries.filter_options(server_only)
    assert opts["first_at"] is not None and opts["last_at"] > opts["first_at"]
    slow = queries.slow_requests(server_only, SLO(ttft_ms=1, tpot_ms=1))
    assert slow.height > 0 and slow["started_at"].null_count() == 0
    picked = queries.request_matches(server_only, "req-3")
    assert picked.height == 1 and picked["started_at"][0] is not None


def test_policies_compared_without_run_ids(server_only: audit.Reader) -> None:
    assert queries.run_list(server_only).height == 0  # no run id: nothing to compare by run
    policies = queries.run_list(server_only, by="policy")
    assert dict(zip(policies["policy"], policies["requests"], strict=True)) == {
        "qp_cost": 11, "least_load": 10}
    summary = queries.run_summaries(server_only, ["least_load", "qp_cost"], by="policy")
    assert summary["policy"].to_list() == ["least_load", "qp_cost"]
    assert summary["requests"].to_list() == [10, 11]
    assert summary["failed"].to_list() == [0, 1]  # req-21, placed by qp_cost
    failures = queries.run_failures(server_only, ["least_load", "qp_cost"], by="policy")
    assert [(p, k.split()[0], n) for p, k, n in failures.rows()] == [("qp_cost", "error", 1)]
    with pytest.raises(ValueError, match="run_id or policy"):
        queries.run_list(server_only, by="replica")  # type: ignore[arg-type]


def test_policies_page_without_run_ids(monkeypatch: pytest.MonkeyPatch, server_only_path: Path) -> None:
    from test_pages import open_page, texts

    at = open_page(monkeypatch, server_only_path, "policies", {"window": "all"})
    assert not at.exception
    assert [r.options for r in at.radio] == [["router policy"]]
    shown = texts(at)
    assert "No runs" not in shown and "qp_cost" in shown and "least_load" in shown
    assert len(at.metric) >= 6  # goodput, attainment, failures for each policy


def test_request_page_of_a_failed_forward(monkeypatch: pytest.MonkeyPatch, server_only_path: Path) -> None:
    from test_pages import open_page, texts

    at = open_page(monkeypatch, server_only_path, "request", {"request_id": "req-21"})
    assert at.metric[0].value == "error"
    warning = " ".join(str(w.value) for w in at.warning)
    assert "seen by the router" in warning and "Connection refused" in warning
    assert "served by no replica" in texts(at)
