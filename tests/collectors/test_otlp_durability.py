"""Durability: a collector process is SIGKILLed mid-stream; after a restart every span whose
export was acknowledged (200) is stored exactly once and the store opens cleanly. With the spool,
acknowledged spans that were not yet committed at the kill come back from the spool."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import duckdb
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

import audit

ROOT = Path(__file__).resolve().parents[2]
NOW = time.time_ns()

# The subprocess skips installing the SQL relations (seconds per open, irrelevant to the receiver).
_LAUNCH = (
    "import sys, audit._relations as r; r.install = lambda con, temporary=False: None; "
    "from collectors.otlp.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(db: Path, port: int, log: IO[bytes], extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, "--db", str(db), "--http-port", str(port), "--grpc-port", "-1",
         *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "collector exited during start"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("collector did not become healthy")


def batch(sender: int, seq: int, n: int) -> tuple[bytes, list[str]]:
    spans, ids = [], []
    for i in range(n):
        sid = ((sender + 1) << 40 | seq << 12 | i + 1).to_bytes(8, "big")
        ids.append(sid.hex())
        spans.append(Span(trace_id=(sender + 1).to_bytes(8, "big") + seq.to_bytes(8, "big"), span_id=sid,
                          name="dur", start_time_unix_nano=NOW, end_time_unix_nano=NOW + 1))
    req = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    return req.SerializeToString(), ids


def test_sigkill_mid_stream_loses_no_acknowledged_span(tmp_path: Path) -> None:
    assert kill_and_restart(tmp_path, ()) == 0


def test_sigkill_with_spool_replays_acknowledged_uncommitted_spans(tmp_path: Path) -> None:
    # Commits are slowed down so that, at the kill, acknowledged spans wait in the spool only.
    replayed = kill_and_restart(tmp_path, ("--spool", "--commit-delay-ms", "300"))
    assert replayed > 0, "nothing came back from the spool: it was not exercised"
    assert not list(Path(f"{tmp_path / 'dur.duckdb'}.spool").glob("*.seg"))  # clean stop: spool empty


def kill_and_restart(tmp_path: Path, extra: tuple[str, ...]) -> int:
    """Returns how many spans the restarted collector replayed from the spool."""
    db = tmp_path / "dur.duckdb"
    port = free_port()
    log = (tmp_path / "collector.log").open("wb")
    t0 = time.monotonic()
    proc = start(db, port, log, extra)
    print(f"start took {time.monotonic() - t0:.1f} s")
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    last_body: dict[str, bytes] = {}

    def sender(k: int) -> None:
        with httpx.Client(timeout=10) as client:
            seq = 0
            while not stop.is_set():
                seq += 1
                body, ids = batch(k, seq, 25)
                try:
                    r = client.post(f"http://127.0.0.1:{port}/v1/traces", content=body,
                                    headers={"content-type": "application/x-protobuf"})
                except httpx.HTTPError:
                    return  # the collector is gone
                if r.status_code == 200:
                    with lock:
                        acked.extend(ids)
                        last_body["b"] = body

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(3)]
    t_send = time.monotonic()
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(acked) < 600 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"acked {len(acked)} spans in {time.monotonic() - t_send:.1f} s")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    stop.set()
    for t in threads:
        t.join(15)
    assert len(acked) >= 100, "too few acknowledged exports before the kill"
    sidecar = Path(f"{db}.collector.json")
    assert sidecar.exists()  # a killed collector leaves its sidecar; the pid is dead

    t0 = time.monotonic()
    proc = start(db, port, log, extra)
    print(f"restart took {time.monotonic() - t0:.1f} s")
    replayed = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["counters"]["spool_replayed_spans"]
    try:
        info = json.loads(sidecar.read_text())
        assert info["pid"] == proc.pid
        reader = audit.open(db)  # goes to the restarted collector through the sidecar
        stored = reader.query("select span_id, count(*) over (partition by trace_id, span_id) as n "
                              "from raw_spans")
        counts = dict(zip(stored["span_id"].to_list(), stored["n"].to_list(), strict=True))
        missing = [s for s in acked if s not in counts]
        assert not missing, f"{len(missing)} acknowledged spans lost, e.g. {missing[:3]}"
        assert set(counts.values()) == {1}
        # Re-delivery of an acknowledged batch after the restart is still stored once.
        before = reader.query("select count(*) as n from raw_spans")["n"][0]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=last_body["b"],
                       headers={"content-type": "application/x-protobuf"})
        assert r.status_code == 200
        assert reader.query("select count(*) as n from raw_spans")["n"][0] == before
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        log.close()
    assert rc == 0, (tmp_path / "collector.log").read_text()
    assert not sidecar.exists()
    return replayed
    con = duckdb.connect(str(db), read_only=True)
    try:
        total = con.sql("select count(*) from raw_spans").fetchall()[0][0]
    finally:
        con.close()
    assert total >= len(set(acked))
