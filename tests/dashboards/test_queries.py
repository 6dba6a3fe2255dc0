"""The query layer judges requests by the one rule the attribution relations hold
(``slo_targets`` → ``int_attr_requests_judged``), at the SLO it is given."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from _stores import mart_store

import audit
from audit import _relations, attribution, queries

SLOS = [audit.SLO(), audit.SLO(ttft_ms=800.0, tpot_ms=60.0)]


def _create_views(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    for rel in _relations.load_relations():
        if rel.name in names:
            con.execute(f"create view {rel.name} as {rel.sql}")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic marts plus the edge cases of the rule: a non-streamed answer (no TTFT of its
    own: its latency stands in), one with neither, and one without a status (counts as ok)."""
    path = mart_store(tmp_path_factory.mktemp("judged") / "audit.duckdb", n=300)
    con = duckdb.connect(str(path))
    try:
        ok = [r[0] for r in con.sql("select request_key from requests where status = 'ok' "
                                    "order by request_key limit 3").fetchall()]
        con.execute("update requests set ttft_ms = null, stream = false, e2e_ms = 5000 "
                    "where request_key = ?", [ok[0]])
        con.execute("update requests set ttft_ms = null, e2e_ms = null where request_key = ?",
                    [ok[1]])
        con.execute("update requests set status = null, ttft_ms = 2500 where request_key = ?",
                    [ok[2]])
        _create_views(con, "int_slo_summary_parts", "slo_summary")
        con.execute("checkpoint")
    finally:
        con.close()
    return path


@pytest.mark.parametrize("slo", SLOS, ids=["defaults", "tighter"])
def test_dashboard_counts_are_the_attribution_layers(db: Path, slo: audit.SLO) -> None:
    reader = audit.open(db)
    summary = reader.query("select sum(requests) as requests, sum(ok) as ok, sum(slow) as slow, "
                           "sum(goodput) as good from slo_summary", slo=slo).row(0, named=True)
    totals = queries.overview_totals(reader, slo).row(0, named=True)
    assert {k: totals[k] for k in summary} == summary
    assert queries.slow_requests(reader, slo, limit=10_000).height == summary["slow"]
    assert queries.slow_page(reader, slo, limit=10_000).causes["requests"].sum() == summary["slow"]
    over_time = queries.requests_over_time(reader, slo)
    assert over_time["good"].sum() == summary["good"]


@pytest.mark.parametrize("slo", SLOS, ids=["defaults", "tighter"])
def test_run_summaries_agree_with_the_cli_comparison(db: Path, slo: audit.SLO) -> None:
    reader = audit.open(db)
    runs = queries.run_summaries(reader, ["run-rr", "run-ca"], slo)
    assert runs["run_id"].to_list() == ["run-rr", "run-ca"]
    cli = attribution.compare_runs(reader, "run-rr", "run-ca", slo=slo).runs
    assert runs["good"].to_list() == cli["goodput"].to_list()
    assert runs["ok"].to_list() == cli["ok"].to_list()
    assert runs["ttft_p50"].to_list() == pytest.approx(cli["ttft_p50_ms"].to_list())


def test_slo_defaults_and_variables_are_the_sql_relations() -> None:
    con = duckdb.connect()
    _create_views(con, "slo_targets")
    targets = "select ttft_slo_ms, tpot_slo_ms from slo_targets"
    default = audit.SLO()
    assert con.execute(targets).fetchone() == (default.ttft_ms, default.tpot_ms)
    for name, value in audit.SLO(ttft_ms=1234.0, tpot_ms=56.0).variables().items():
        con.execute(f"set variable {name} = {value}")
    assert con.execute(targets).fetchone() == (1234.0, 56.0)
