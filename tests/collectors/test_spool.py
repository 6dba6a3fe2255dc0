"""The spool (``CollectorConfig(spool=True)``): exports acknowledged once synced to
``<db>.spool/``, committed later in large groups, replayed at the next start when the process
died first (the SIGKILL case is in test_otlp_durability.py)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import semconv
from collectors.otlp import Collector, CollectorConfig
from collectors.otlp._errors import StartError, WriterUnavailable
from collectors.otlp._spool import Spool, encode_record, read_segment, spool_path


def _spans(n: int, name: str = "s", attributes: dict[str, object] | None = None) -> list:
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "spool"}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("spool")
    for i in range(n):
        with tracer.start_as_current_span(f"{name}{i}", attributes={"i": i, **(attributes or {})}):
            pass
    spans = list(mem.get_finished_spans())
    provider.shutdown()
    return spans


def _count(c: Collector) -> int:
    r = httpx.post(c.query_url, json={"sql": "select count(*) as n from raw_spans"},
                   headers={"x-routeaudit-query": "1"})
    return int(pa.ipc.open_stream(r.content).read_all().to_pylist()[0]["n"])


def _table(n: int) -> pa.Table:
    return pa.table({"trace_id": [f"{i:032x}" for i in range(n)], "v": list(range(n))})


# -- the log itself -------------------------------------------------------------------------------
def test_records_round_trip_rotate_and_are_deleted_once_committed(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.spool", segment_bytes=1)  # one record per segment
    spool.start()
    futures, segments = [], []
    for i in range(4):
        fut: Future[None] = Future()
        events = pa.table({"e": [1.5] * i}) if i else None
        segments.append(spool.append_record(encode_record(_table(10 + i), events), fut))
        futures.append(fut)
    for fut in futures:
        fut.result(10)  # synced
    files = sorted((tmp_path / "s.spool").glob("*.seg"))
    assert len(files) == 4 and len(set(segments)) == 4
    records, torn = read_segment(files[2])
    assert torn == 0 and records[0][0].equals(_table(12)) and records[0][1].num_rows == 2
    spool.release(segments[:2])
    assert len(list((tmp_path / "s.spool").glob("*.seg"))) == 2
    spool.close()  # the uncommitted ones stay for the next start
    assert len(list((tmp_path / "s.spool").glob("*.seg"))) == 2

    replayed: list[int] = []
    again = Spool(tmp_path / "s.spool")
    assert again.replay(lambda s, e: replayed.append(s.num_rows) or s.num_rows,
                        max_group_spans=1000) == (2, 25)
    assert replayed == [12, 13] and not list((tmp_path / "s.spool").glob("*.seg"))


def test_a_torn_tail_is_ignored_and_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path / "s.spool")
    spool.start()
    fut: Future[None] = Future()
    spool.append_record(encode_record(_table(5), None), fut)
    fut.result(10)
    spool.close()
    seg = next((tmp_path / "s.spool").glob("*.seg"))
    whole = encode_record(_table(7), None)
    data = b"".join(bytes(memoryview(p).cast("B")) for p in whole)
    with seg.open("ab") as f:
        f.write(data[: len(data) // 2])  # a crash in the middle of a write
    got: list[int] = []
    with caplog.at_level(logging.WARNING, logger="routeaudit.collector"):
        assert Spool(tmp_path / "s.spool").replay(lambda s, e: got.append(s.num_rows) or 0,
                                                  max_group_spans=1000) == (1, 5)
    assert got == [5]
    assert "not a whole record" in caplog.text


def test_a_failed_sync_acknowledges_nothing_and_the_next_one_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    real = os.fdatasync
    disk = {"broken": True, "calls": 0}

    def flaky(fd: int) -> None:
        disk["calls"] += 1
        if disk["broken"]:
            raise OSError(errno.EIO, "I/O error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", flaky)
    spool = Spool(tmp_path / "s.spool")
    spool.start()
    try:
        bad: Future[None] = Future()
        spool.append_record(encode_record(_table(3), None), bad)
        with pytest.raises(WriterUnavailable, match="sync failed"):  # answered 503, retried
            bad.result(10)
        time.sleep(0.3)
        assert disk["calls"] == 1  # the failed bytes are settled, not synced again in a loop
        disk["broken"] = False
        good: Future[None] = Future()
        spool.append_record(encode_record(_table(4), None), good)
        good.result(10)  # and the spool keeps working
    finally:
        spool.close()


# -- through the collector ---------------------------------------------------------------------------
def test_exports_are_acknowledged_before_a_slow_commit(tmp_path: Path) -> None:
    release = threading.Event()
    cfg = CollectorConfig(db_path=tmp_path / "sp.duckdb", http_port=0, grpc_port=None, spool=True)
    with Collector(cfg, before_commit=lambda: release.wait(30)) as c:
        exporter = OTLPSpanExporter(endpoint=c.traces_url, timeout=10)
        t0 = time.monotonic()
        for k in range(3):
            assert exporter.export(_spans(20, f"b{k}")) is SpanExportResult.SUCCESS
        assert time.monotonic() - t0 < 10  # nobody waited for the blocked commit
        assert _count(c) == 0
        assert c.health()["queue_spans"] == 60 and c.health()["spool_bytes"] > 0
        release.set()
        deadline = time.monotonic() + 30
        while _count(c) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count(c) == 60
        exporter.shutdown()
    assert not list(spool_path(cfg.db_path).glob("*.seg"))


def test_failed_commits_of_acknowledged_exports_are_retried(tmp_path: Path) -> None:
    failures = {"left": 3}

    def flaky() -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise OSError("disk hiccup")

    cfg = CollectorConfig(db_path=tmp_path / "sp.duckdb", http_port=0, grpc_port=None, spool=True)
    with Collector(cfg, before_commit=flaky) as c:
        exporter = OTLPSpanExporter(endpoint=c.traces_url, timeout=10)
        assert exporter.export(_spans(30)) is SpanExportResult.SUCCESS
        deadline = time.monotonic() + 30
        while _count(c) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count(c) == 30
        assert c.metrics.value("commit_failures") == 3
        assert c.health()["status"] == "ok" and c.health()["last_error"] is None
        exporter.shutdown()


def test_spans_left_in_the_spool_are_replayed_even_without_spool(tmp_path: Path) -> None:
    """What a crash leaves: synced records never released. A collector started without the
    spool still replays them (they were acknowledged), then removes the folder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from collectors.otlp._decode import decode_protobuf

    db = tmp_path / "sp.duckdb"
    batch = decode_protobuf(encode_spans(_spans(15)).SerializeToString(), time.time_ns())
    left = Spool(spool_path(db))
    left.start()
    fut: Future[None] = Future()
    left.append_record(encode_record(batch.spans, batch.events), fut)
    fut.result(10)
    left.close()
    assert list(spool_path(db).glob("*.seg"))

    with Collector(CollectorConfig(db_path=db, http_port=0, grpc_port=None)) as c:
        assert c.metrics.value("spool_replayed_spans") == 15
        assert _count(c) == 15
    assert not spool_path(db).exists()


_DECISION = {semconv.REQUEST_ID: "req", semconv.REQUEST_PREFIX_HASHES: ["00ff", "0a0b"]}
_REPLICA = {semconv.REPLICA_ID: "rep-0", semconv.RESPONSE_FINISH_REASONS: ["stop"]}
_TYPED_SQL = ("select name, a_request_id, a_prefix_hashes, a_replica_id, a_finish_reasons "
              "from raw_spans order by name")


def _typed_rows(c: Collector) -> dict[str, tuple]:
    r = httpx.post(c.query_url, json={"sql": _TYPED_SQL}, headers={"x-routeaudit-query": "1"})
    return {row["name"]: tuple(row.values())[1:] for row in pa.ipc.open_stream(r.content).read_all().to_pylist()}


def _assert_typed(rows: dict[str, tuple], names: dict[str, dict[str, object]]) -> None:
    for prefix, attrs in names.items():
        want = (attrs.get(semconv.REQUEST_ID), attrs.get(semconv.REQUEST_PREFIX_HASHES),
                attrs.get(semconv.REPLICA_ID), attrs.get(semconv.RESPONSE_FINISH_REASONS))
        got = [v for k, v in rows.items() if k.startswith(prefix)]
        assert got and all(g == want for g in got), (prefix, got)


def test_batches_with_different_typed_columns_commit_in_one_group(tmp_path: Path) -> None:
    """A batch leaves its all-null typed columns out (of the spool record and the insert), so
    batches of decision and replica spans differ in columns; a group merging them commits in one
    go and keeps every value."""
    release = threading.Event()
    cfg = CollectorConfig(db_path=tmp_path / "sp.duckdb", http_port=0, grpc_port=None, spool=True)
    with Collector(cfg, before_commit=lambda: release.wait(30)) as c:
        exporter = OTLPSpanExporter(endpoint=c.traces_url, timeout=10)
        for name, attrs in (("a", _DECISION), ("b", _REPLICA), ("c", _DECISION), ("d", {})):
            assert exporter.export(_spans(4, name, attrs)) is SpanExportResult.SUCCESS
        release.set()
        deadline = time.monotonic() + 30
        while _count(c) < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count(c) == 16
        assert c.metrics.value("commit_failures") == 0 and c.metrics.value("commits") < 4
        _assert_typed(_typed_rows(c), {"a": _DECISION, "b": _REPLICA, "c": _DECISION, "d": {}})
        exporter.shutdown()


def test_spooled_records_with_different_columns_are_replayed_together(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from audit._store import without_null_columns
    from collectors.otlp._decode import decode_protobuf

    db = tmp_path / "sp.duckdb"
    left = Spool(spool_path(db))
    left.start()
    for name, attrs in (("a", _DECISION), ("b", _REPLICA)):
        batch = decode_protobuf(encode_spans(_spans(3, name, attrs)).SerializeToString(), time.time_ns())
        fut: Future[None] = Future()
        left.append_record(encode_record(without_null_columns(batch.spans), batch.events), fut)
        fut.result(10)
    left.close()

    with Collector(CollectorConfig(db_path=db, http_port=0, grpc_port=None)) as c:
        assert c.metrics.value("spool_replayed_spans") == 6
        assert c.metrics.value("commit_failures") == 0
        _assert_typed(_typed_rows(c), {"a": _DECISION, "b": _REPLICA})


def test_an_unusable_spool_folder_is_a_start_error(tmp_path: Path) -> None:
    db = tmp_path / "sp.duckdb"
    spool_path(db).write_text("not a folder")
    with pytest.raises(StartError, match="spool"):
        Collector(CollectorConfig(db_path=db, http_port=0, grpc_port=None, spool=True)).start()
