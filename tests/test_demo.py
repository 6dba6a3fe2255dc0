"""The README's main job, end to end: testbed → OTel SDK → OTLP/HTTP → collector → DuckDB →
relations → attribution, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import audit

ROOT = Path(__file__).resolve().parent.parent


def test_demo_end_to_end(tmp_path: Path) -> None:
    db = tmp_path / "demo.duckdb"
    out = subprocess.run(
        [sys.executable, "-m", "routeaudit", "demo", "--db", str(db), "--requests", "150",
         "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "replayed 150 requests" in out.stdout
    assert "routeaudit dashboard --db" in out.stdout
    assert "warning" not in out.stderr
    reader = audit.open(db)
    # Every request became one row with all three sides, linked by trace.
    row = reader.query(
        "select count(*) as n, count(*) filter (where has_client and has_router and has_replica) "
        "as complete, count(distinct run_id) as runs from requests").row(0, named=True)
    assert row == {"n": 150, "complete": row["complete"], "runs": 1}
    assert row["complete"] >= 140  # rejected requests never reach a replica
    # The summary's numbers are the store's numbers.
    slow = reader.query("select count(*) as n from slow_requests")["n"][0]
    assert "run mixed-qp_cost-s0: 150 requests" in out.stdout
    assert f" {slow} slow, goodput" in out.stdout
    # Ground truth sits beside the store, one line per request, and is not part of it.
    truth = (tmp_path / "demo.groundtruth.jsonl").read_text().splitlines()
    assert len(truth) == 150
    ids = {json.loads(line)["request_id"] for line in truth}
    stored = set(reader.query("select request_id from requests")["request_id"].to_list())
    assert ids == stored


def test_demo_rejects_an_unknown_scenario(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "routeaudit", "demo", "--db", str(tmp_path / "x.duckdb"),
         "--scenario", "nope", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown scenario 'nope'" in out.stderr and "Traceback" not in out.stderr
