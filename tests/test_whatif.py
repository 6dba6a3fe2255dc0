"""``routeaudit whatif``: recorded testbed runs (spans through the real SDK, OTLP/HTTP and a
collector into a DuckDB store) are replayed from the store alone; the replay under the recorded
policy must reproduce the recorded TTFT, and the ranking of two recorded policies must hold."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

import audit
import testbed
from audit import queries
from audit.attribution import compare_runs
from collectors.otlp import Collector, default_config
from routeaudit import cli
from routeaudit._whatif import (
    Recorded,
    RecordedRequest,
    WhatIfError,
    WhatIfResult,
    _block_tokens,
    _poll_interval,
    format_whatif,
    outside_engine_ms,
    run_whatif,
)
from testbed.emit import OTelEmitter
from testbed.workloads import hot_prefix

KV_TOKENS = 24_000
SLOW_REPLICA, SLOW_SPEED = 2, 0.5
TOLERANCE = 0.15


@dataclass(frozen=True)
class Recording:
    db: Path
    runs: dict[str, testbed.RunSummary]  # policy -> summary


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """Prefix-heavy traffic (six 4k-token system prompts) on three replicas, one at half speed,
    with a KV pool that holds only a few prompts: round_robin spreads every prompt everywhere and
    recomputes it, cache_aware keeps each on one replica."""
    db = tmp_path_factory.mktemp("whatif") / "recorded.duckdb"
    requests = hot_prefix(150, random.Random(1), rate=5.0, n_prefixes=6, prefix_tokens=4096,
                          suffix_tokens=256, output_tokens=64)
    fleet = testbed.FleetConfig(n_replicas=3,
                                replica=testbed.ReplicaConfig(kv_capacity_tokens=KV_TOKENS),
                                replica_overrides={SLOW_REPLICA: {"speed": SLOW_SPEED}})
    runs = {}
    with Collector(default_config(db_path=db, http_port=0, grpc_port=None)) as collector:
        for policy in ("round_robin", "cache_aware"):
            emitter = OTelEmitter(OTLPSpanExporter(endpoint=collector.traces_url, timeout=60))
            runs[policy] = testbed.run_scenario("baseline", policy=policy, workload=requests,
                                                fleet=fleet, emitter=emitter, progress=False)
    return Recording(db, runs)


def _quiet(_text: str) -> None:
    pass


@pytest.fixture(scope="module")
def stored(recording: Recording, tmp_path_factory: pytest.TempPathFactory) -> WhatIfResult:
    """round_robin's recording replayed as recorded and under cache_aware, both stored."""
    out = tmp_path_factory.mktemp("whatif-out") / "whatif.duckdb"
    return run_whatif(recording.db, policy="cache_aware",
                      run=recording.runs["round_robin"].run_id, out=out, progress=False,
                      log=_quiet)


@pytest.fixture(scope="module")
def cache_aware_replay(recording: Recording) -> WhatIfResult:
    return run_whatif(recording.db, policy="round_robin",
                      run=recording.runs["cache_aware"].run_id, out=None, progress=False,
                      log=_quiet)


def _close(simulated: float | None, recorded: float | None) -> bool:
    assert simulated is not None and recorded is not None
    return abs(simulated / recorded - 1.0) <= TOLERANCE


def test_replay_under_the_recorded_policy_reproduces_ttft(
        stored: WhatIfResult, cache_aware_replay: WhatIfResult) -> None:
    for result in (stored, cache_aware_replay):
        rec, rep = result.recorded, result.replay
        assert rep is not None and rep.policy == rec.policy
        assert rep.requests == rec.requests == 150
        assert _close(rep.ttft_p50_ms, rec.ttft_p50_ms), (rec.policy, rec.ttft_p50_ms, rep.ttft_p50_ms)
        assert _close(rep.ttft_p90_ms, rec.ttft_p90_ms), (rec.policy, rec.ttft_p90_ms, rep.ttft_p90_ms)


def test_the_recorded_figures_are_the_runs_own(recording: Recording, stored: WhatIfResult) -> None:
    """The 'recorded' column is the testbed run as the store holds it (same percentiles up to
    the interpolation between order statistics)."""
    summary = recording.runs["round_robin"]
    assert stored.recorded.requests == summary.n_requests
    assert stored.recorded.rejected == summary.n_rejected
    assert stored.recorded.ttft_p50_ms == pytest.approx(summary.ttft_p50_ms, rel=0.02)


def test_the_policy_ranking_is_reproduced(recording: Recording, stored: WhatIfResult,
                                          cache_aware_replay: WhatIfResult) -> None:
    rr_recorded = recording.runs["round_robin"]
    ca_recorded = recording.runs["cache_aware"]
    # the recorded ranking, with a margin that makes it a ranking and not noise
    assert ca_recorded.ttft_p50_ms < 0.5 * rr_recorded.ttft_p50_ms
    assert ca_recorded.ttft_p90_ms < 0.5 * rr_recorded.ttft_p90_ms
    # the what-if of round_robin's traffic under cache_aware ranks them the same way, and so
    # does the what-if of cache_aware's traffic under round_robin
    for rr, ca in ((stored.replay, stored.whatif),
                   (cache_aware_replay.whatif, cache_aware_replay.replay)):
        assert rr is not None and ca is not None
        assert rr.policy == "round_robin" and ca.policy == "cache_aware"
        assert ca.ttft_p50_ms is not None and rr.ttft_p50_ms is not None
        assert ca.ttft_p90_ms is not None and rr.ttft_p90_ms is not None
        assert ca.ttft_p50_ms < 0.5 * rr.ttft_p50_ms
        assert ca.ttft_p90_ms < 0.5 * rr.ttft_p90_ms
        assert ca.within_slo >= rr.within_slo


def test_calibration_recovers_the_recorded_fleet(stored: WhatIfResult) -> None:
    cal = stored.calibration
    default = testbed.CostModel()
    assert cal.speeds == {"replica-0": 1.0, "replica-1": 1.0,
                          f"replica-{SLOW_REPLICA}": pytest.approx(SLOW_SPEED, abs=0.05)}
    assert cal.cost.prefill_ms_per_token == pytest.approx(default.prefill_ms_per_token, rel=0.05)
    assert cal.cost.step_overhead_ms == pytest.approx(default.step_overhead_ms, rel=0.25)
    assert cal.kv_capacity_tokens == pytest.approx(KV_TOKENS, rel=0.1)
    window = stored.recorded_window
    assert window.block_tokens == 64 and window.n_routers == 1
    assert window.telemetry_interval_s == pytest.approx(0.25)
    assert window.pending_correction is True


def test_both_runs_are_stored_and_compare_reads_them(stored: WhatIfResult) -> None:
    """The simulated runs went through OTel → OTLP/HTTP → collector: the store's own judgement
    of them (``routeaudit compare``) gives the figures whatif printed."""
    assert stored.out is not None and stored.replay is not None
    reader = audit.open(stored.out)
    runs = sorted(reader.query("select distinct run_id from requests")["run_id"].to_list())
    assert runs == sorted([str(stored.replay.run_id), str(stored.whatif.run_id)])
    comparison = compare_runs(reader, str(stored.replay.run_id), str(stored.whatif.run_id))
    by_role = {row["role"]: row for row in comparison.runs.iter_rows(named=True)}
    for role, figures in (("baseline", stored.replay), ("candidate", stored.whatif)):
        row = by_role[role]
        assert row["requests"] == figures.requests
        assert row["goodput"] == figures.within_slo
        assert row["ttft_p50_ms"] == pytest.approx(figures.ttft_p50_ms, rel=1e-6)
        assert row["ttft_p90_ms"] == pytest.approx(figures.ttft_p90_ms, rel=1e-6)
        assert row["tpot_p50_ms"] == pytest.approx(figures.tpot_p50_ms, rel=1e-6)
    # the dashboard's Policies page lists them with their policies
    listed = {r["run_id"]: r["policies"] for r in queries.run_list(reader).iter_rows(named=True)}
    assert listed == {stored.replay.run_id: "round_robin", stored.whatif.run_id: "cache_aware"}


def test_a_second_whatif_into_the_same_store_is_refused(recording: Recording,
                                                       stored: WhatIfResult) -> None:
    with pytest.raises(WhatIfError, match="already holds run"):
        run_whatif(recording.db, policy="cache_aware", run=recording.runs["round_robin"].run_id,
                   out=stored.out, progress=False, log=_quiet)


def test_more_replicas_and_slower_telemetry_are_the_what_if_fleet(recording: Recording) -> None:
    result = run_whatif(recording.db, policy="round_robin",
                        run=recording.runs["round_robin"].run_id, replicas=4,
                        telemetry_interval_s=2.0, out=None, progress=False, log=_quiet)
    assert result.replay is not None and result.replay.replicas == 3
    assert result.whatif.replicas == 4
    assert str(result.whatif.run_id).endswith("whatif-round_robin-4r-2s")
    # a fourth nominal replica takes load off the slow one
    assert result.whatif.ttft_p90_ms is not None and result.replay.ttft_p90_ms is not None
    assert result.whatif.ttft_p90_ms < result.replay.ttft_p90_ms


def test_a_time_window_replays_only_its_arrivals(recording: Recording) -> None:
    run = recording.runs["cache_aware"].run_id
    reader = audit.open(recording.db)
    arrivals = reader.query("select client_start from requests where run_id = ? "
                            "order by client_start", [run])["client_start"].to_list()
    since, until = arrivals[30], arrivals[90]
    inside = sum(1 for t in arrivals if since <= t < until)
    result = run_whatif(recording.db, policy="round_robin", run=run, since=since.isoformat(),
                        until=until.isoformat(), out=None, progress=False, log=_quiet)
    assert result.recorded.requests == inside < len(arrivals)
    assert result.replay is not None and result.replay.requests == inside
    assert result.whatif.requests == inside


@pytest.mark.parametrize(("argv", "message"), [
    (["--policy", "nope"], "unknown policy 'nope'; known: cache_aware"),
    (["--policy", "qp_cost"], "the window holds 2 runs"),
    (["--policy", "qp_cost", "--run", "no-such-run"], "no requests of run 'no-such-run'"),
    (["--policy", "qp_cost", "--since", "2030-01-01T00:00:00Z"], "no requests from 2030"),
    (["--policy", "qp_cost", "--until", "yesterday"], "--until wants an ISO time"),
    (["--policy", "qp_cost", "--replicas", "0"], "--replicas must be >= 1"),
])
def test_bad_input_is_one_line(recording: Recording, capsys: pytest.CaptureFixture[str],
                               argv: list[str], message: str) -> None:
    code = cli.main(["whatif", "--db", str(recording.db), "--quiet", *argv])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USER_ERROR
    assert err.startswith("routeaudit whatif: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_prints_the_table(recording: Recording, capsys: pytest.CaptureFixture[str]) -> None:
    run = recording.runs["cache_aware"].run_id
    code = cli.main(["whatif", "--db", str(recording.db), "--run", run, "--policy", "qp_cost",
                     "--no-store", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert any(line.split()[-3:] == ["cache_aware", "cache_aware", "qp_cost"]
               for line in lines if line.startswith("policy"))
    for label in ("TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms", "within SLO",
                  "goodput req/s", "timeouts/cancelled", "rejected", "failed"):
        assert any(line.startswith(label) for line in lines), label
    assert "stored in" not in out


def _request(input_tokens: int, n_hashes: int) -> RecordedRequest:
    return RecordedRequest(request_key="k", request_id="r", arrival_ns=0,
                           input_tokens=input_tokens, output_tokens=1, max_tokens=16,
                           prefix_hashes=tuple(f"{i:016x}" for i in range(n_hashes)),
                           status="ok", ttft_ms=1.0, tpot_ms=None, e2e_ms=1.0)


@pytest.mark.parametrize(("shapes", "expected"), [
    ([(1000, 2), (513, 2), (5000, 10)], 512),       # Mooncake's 512-token blocks
    ([(2304, 36), (100, 2)], 64),                   # 64-token chunks
    ([(700, 1)], 1024),                             # one hash only bounds it from below
    ([(100, 0)], None),                             # no hashes: nothing to infer
])
def test_tokens_per_prefix_hash_are_inferred(shapes: list[tuple[int, int]],
                                             expected: int | None) -> None:
    assert _block_tokens([_request(i, n) for i, n in shapes]) == expected


@pytest.mark.parametrize(("oldest_s", "expected"), [
    (0.249, 0.25), (1.999, 2.0), (0.999, 1.0), (4.9, 5.0), (1.3, 1.3), (0.0125, 0.0125),
])
def test_poll_interval_is_read_from_the_oldest_telemetry(oldest_s: float, expected: float) -> None:
    assert _poll_interval(oldest_s) == pytest.approx(expected)


def test_a_store_without_requests_is_one_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import duckdb

    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("create table t (x integer)")
    con.close()
    code = cli.main(["whatif", "--db", str(foreign), "--policy", "qp_cost", "--quiet"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USER_ERROR
    assert err.strip() == "routeaudit whatif: no requests in the store (runs in the store: none)"


def test_without_a_replayable_recorded_policy_the_table_has_two_columns(
        stored: WhatIfResult) -> None:
    """A third-party router names no policy the testbed knows: recorded and what-if only."""
    result = dataclasses.replace(stored, replay=None, notes=("no replay under smg",))
    lines = format_whatif(result).splitlines()
    header = next(line for line in lines if line.strip().startswith("recorded"))
    assert header.split() == ["recorded", "what-if"]
    ttft = next(line for line in lines if line.startswith("TTFT p50 ms"))
    assert "%" not in ttft  # nothing to compare the what-if with
    assert "note: no replay under smg" in lines


def test_time_outside_the_engines_is_measured_per_request() -> None:
    def req(ttft: float | None, engine: float | None, status: str = "ok") -> RecordedRequest:
        return dataclasses.replace(_request(100, 0), ttft_ms=ttft, engine_ttft_ms=engine,
                                   status=status)

    window = Recorded(
        description="", run_ids=("r",), requests=(
            req(900.0, 100.0), req(300.0, 100.0), req(150.0, 100.0), req(100.0, 100.0),
            req(5000.0, 10.0, status="timeout"), req(None, 50.0), req(80.0, None)),
        dropped=0, policy=None, replicas=(), n_routers=1, telemetry_interval_s=None,
        pending_correction=None, admission_limit=None, client_timeout_s=None, block_tokens=None)
    p50, p90 = outside_engine_ms(window) or (None, None)
    assert p50 == pytest.approx(125.0)  # of 800, 200, 50, 0: ok requests with both sides
    assert p90 == pytest.approx(620.0)
    assert outside_engine_ms(dataclasses.replace(window, requests=window.requests[-2:])) is None
