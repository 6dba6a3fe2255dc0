"""audit.attribution: compare_runs, capacity and summary_text on hand-built stores."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import duckdb
import polars as pl
import pytest
from test_attribution import Fleet

from audit import attribution


class ConReader:
    """A reader over one DuckDB connection; sets the SLO variables like audit.Reader does."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def query(self, sql: str, params: Sequence[Any] | None = None, slo: Any = None
              ) -> pl.DataFrame:
        if slo is not None:
            self.con.execute(f"set variable routeaudit_ttft_slo_ms = {float(slo.ttft_ms)}"
                             if hasattr(slo, "ttft_ms") else
                             f"set variable routeaudit_ttft_slo_ms = {float(slo['ttft_ms'])}")
        return self.con.sql(sql, params=list(params) if params else None).pl()


def two_runs() -> duckdb.DuckDBPyConnection:
    f = Fleet()
    for i in range(20):
        f.request(f"a{i}", start=100.0 * i, ttft=1000.0 + 100 * i, input_tokens=100,
                  run_id="base")
        f.request(f"b{i}", start=100.0 * i, ttft=100.0 + 10 * i, input_tokens=100,
                  run_id="cand")
    f.request("a_to", start=50.0, ttft=None, input_tokens=100, run_id="base",
              status="timeout", output_tokens=0, tpot=None)
    return f.store()


def test_compare_runs_counts_failures_and_tests_ttft() -> None:
    cmp = attribution.compare_runs(ConReader(two_runs()), "base", "cand",
                                   slo={"ttft_ms": 2000.0, "tpot_ms": 100.0})
    base = cmp.runs.filter(pl.col("role") == "baseline").row(0, named=True)
    cand = cmp.runs.filter(pl.col("role") == "candidate").row(0, named=True)
    assert (base["requests"], base["timeouts"], base["goodput"]) == (21, 1, 11)
    assert base["attainment"] == pytest.approx(11 / 21)
    assert (cand["requests"], cand["goodput"]) == (20, 20)
    assert cmp.ttft_test["prob_candidate_faster"] == pytest.approx(1.0)
    assert cmp.significant
    assert cmp.finish_reasons.height >= 2


def test_capacity_follows_littles_law() -> None:
    f = Fleet()
    for i in range(4):  # each execution lasts 1000 ms (500 prefill + 500 decode), 2 at once
        f.served(f"c{i}", "A", arrive=1000.0 * (i // 2), queue=0.0, input_tokens=500)
    cap = attribution.capacity(ConReader(f.store()), target_qps=100.0)
    assert cap.service_s == pytest.approx(1.0)
    assert cap.concurrency == pytest.approx(2.0)
    assert cap.replicas == 50
    assert cap.replicas_with_headroom == math.ceil(50 * 1.3)
    fixed = attribution.capacity(ConReader(f.store()), 200.0, concurrency=64, headroom=0.3)
    assert (fixed.replicas, fixed.replicas_with_headroom) == (4, 6)


def test_summary_text_names_runs_and_causes() -> None:
    from test_attribution import load_blind_fleet

    text = attribution.summary_text(ConReader(load_blind_fleet().store()))
    assert "run run1:" in text
    assert "misrouting 1" in text


def test_public_names() -> None:
    assert sorted(attribution.__all__) == sorted(
        ["RunComparison", "Capacity", "compare_runs", "capacity", "summary_text"])
