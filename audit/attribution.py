"""Run comparison, capacity and the CLI summary over the attribution relations.

Every function takes a reader (:class:`audit.Reads`, such as :class:`audit.Reader`) and plain
values; an SLO is an :class:`audit.SLO` (None: the reader's own). Aggregation happens in DuckDB; Python only
combines a handful of numbers (no per-row loops). Formulas: ``docs/attribution.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from audit._reads import Reads
from audit._slo import SLO

__all__ = ["RunComparison", "Capacity", "compare_runs", "capacity", "summary_text"]



# --------------------------------------------------------------------------------------------
# compare_runs
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunComparison:
    """Two runs side by side. ``runs``: one row per run (``role`` baseline/candidate);
    ``finish_reasons``: (run_id, finish_reason, requests); ``ttft_test``: Mann-Whitney U on the
    TTFT of successful requests (u, z, p_value two-sided, normal approximation with tie
    correction, n_baseline, n_candidate, prob_candidate_faster = P(candidate < baseline))."""

    runs: pl.DataFrame
    finish_reasons: pl.DataFrame
    ttft_test: dict[str, float | int | None] = field(default_factory=dict)

    @property
    def significant(self) -> bool:
        p = self.ttft_test.get("p_value")
        return p is not None and float(p) < 0.05


# The judgement (status, TTFT with the latency standing in, good) is int_attr_requests_judged's.
_RUN_STATS_SQL = """
with
judged as (
    select
        *,
        client_start + to_microseconds(cast(round(coalesce(e2e_ms, 0) * 1000) as bigint))
            as ended_at
    from int_attr_requests_judged
    where run_id in (?, ?)
)
select
    run_id,
    count(*) as requests,
    count(*) filter (where is_ok) as ok,
    count(*) filter (where is_good) as goodput,
    count(*) filter (where is_good) / count(*) as attainment,
    count(*) filter (where is_good)
        / nullif(date_diff('microsecond', min(client_start), max(ended_at)) / 1e6, 0)
        as goodput_rps,
    count(*) filter (where status = 'timeout') as timeouts,
    count(*) filter (where status = 'rejected') as rejected,
    count(*) filter (where status = 'error') as errors,
    count(*) filter (where status = 'cancelled') as cancelled,
    count(*) filter (where status not in ('ok', 'timeout', 'rejected', 'error', 'cancelled'))
        as other_status,
    quantile_cont(ttft_ms, 0.5) filter (where is_ok) as ttft_p50_ms,
    quantile_cont(ttft_ms, 0.9) filter (where is_ok) as ttft_p90_ms,
    quantile_cont(ttft_ms, 0.99) filter (where is_ok) as ttft_p99_ms,
    quantile_cont(tpot_ms, 0.5) filter (where is_ok) as tpot_p50_ms,
    quantile_cont(tpot_ms, 0.9) filter (where is_ok) as tpot_p90_ms,
    quantile_cont(tpot_ms, 0.99) filter (where is_ok) as tpot_p99_ms,
    avg(output_tokens) filter (where is_ok) as output_tokens_mean,
    quantile_cont(output_tokens, 0.5) filter (where is_ok) as output_tokens_p50
from judged
group by run_id
"""

_FINISH_SQL = """
select run_id, coalesce(finish_reason, '(none)') as finish_reason, count(*) as requests
from requests
where run_id in (?, ?)
group by all
order by run_id, requests desc, finish_reason
"""

# Mann-Whitney U with average ranks for ties; the tie term feeds the variance correction.
_MANN_WHITNEY_SQL = """
with
samples as (
    select run_id = ? as is_candidate, ttft_ms as x
    from int_attr_requests_judged
    where run_id in (?, ?) and is_ok and ttft_ms is not null
),
ordered as (
    select is_candidate, x, row_number() over (order by x) as position from samples
),
ranked as (
    select is_candidate, x, avg(position) over (partition by x) as r from ordered
),
ties as (
    select sum(t * t * t - t) as tie_term from (select count(*) as t from samples group by x)
)
select
    count(*) filter (where not is_candidate) as n_baseline,
    count(*) filter (where is_candidate) as n_candidate,
    sum(r) filter (where is_candidate) as rank_sum_candidate,
    any_value(tie_term) as tie_term
from ranked, ties
"""


def compare_runs(reader: Reads, baseline_run: str, candidate_run: str,
                 slo: SLO | None = None) -> RunComparison:
    """Compare two runs of the same arrival trace: latency percentiles, goodput, attainment,
    failures by kind (never dropped from denominators), output lengths and finish reasons, and
    a Mann-Whitney U test on TTFT of successful requests."""
    stats = reader.query(_RUN_STATS_SQL, [baseline_run, candidate_run], slo=slo)
    roles = pl.DataFrame({"run_id": [baseline_run, candidate_run],
                          "role": ["baseline", "candidate"]})
    runs = roles.join(stats, on="run_id", how="left")
    finish = reader.query(_FINISH_SQL, [baseline_run, candidate_run])
    mw = reader.query(_MANN_WHITNEY_SQL, [candidate_run, baseline_run, candidate_run])
    return RunComparison(runs=runs, finish_reasons=finish, ttft_test=_mann_whitney(mw.row(0)))


def _mann_whitney(row: tuple[Any, ...]) -> dict[str, float | int | None]:
    n1, n2, rank_sum, tie_term = (int(row[0] or 0), int(row[1] or 0), row[2], row[3])
    out: dict[str, float | int | None] = {"n_baseline": n1, "n_candidate": n2, "u": None,
                                          "z": None, "p_value": None,
                                          "prob_candidate_faster": None}
    if n1 == 0 or n2 == 0 or rank_sum is None:
        return out
    # U counts pairs where the candidate is larger (slower); ties count one half
    u = float(rank_sum) - n2 * (n2 + 1) / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - float(tie_term or 0) / (n * (n - 1) if n > 1 else 1))
    z = 0.0 if var <= 0 else (u - n1 * n2 / 2.0) / math.sqrt(var)
    out.update(u=u, z=z, p_value=math.erfc(abs(z) / math.sqrt(2.0)),
               prob_candidate_faster=1.0 - u / (n1 * n2))
    return out


# --------------------------------------------------------------------------------------------
# capacity (Little's law)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capacity:
    """Replicas needed for ``target_qps``: N = ceil(Q * T_e / C), then ceil(N * (1 + headroom)).
    ``service_s`` (T_e) is the median server-side time of successful executions (queue +
    prefill + decode); ``concurrency`` (C) is given or the median over replicas of the peak
    number of executions in flight at once."""

    target_qps: float
    service_s: float | None
    concurrency: float | None
    concurrency_observed: bool
    in_flight: float | None
    replicas: int | None
    replicas_with_headroom: int | None
    headroom: float


_CAPACITY_SQL = """
with
execs as (
    select e.replica, e.start_at,
        coalesce(e.end_at, e.start_at + to_microseconds(cast(round(e.e2e_ms * 1000) as bigint)))
            as end_at,
        e.e2e_ms, coalesce(e.status, 'ok') as status
    from executions as e
    left join requests as r on e.request_key = r.request_key
    where ? is null or r.run_id = ?
),
edges as (
    select replica, start_at as t, 1 as d from execs
    union all
    select replica, end_at as t, -1 as d from execs
),
running as (
    select replica, sum(d) over (partition by replica order by t, d rows unbounded preceding)
        as in_flight
    from edges
),
peaks as (select replica, max(in_flight) as peak from running group by replica)
select
    (select median(e2e_ms) / 1000.0 from execs where status = 'ok') as service_s,
    (select median(peak) from peaks) as peak_concurrency
"""


def capacity(reader: Reads, target_qps: float, headroom: float = 0.3, *,
             concurrency: float | None = None, run: str | None = None) -> Capacity:
    """Replicas for ``target_qps`` by Little's law: N = ceil(Q * T_e / C)."""
    row = reader.query(_CAPACITY_SQL, [run, run]).row(0)
    service_s = float(row[0]) if row[0] is not None else None
    observed = concurrency is None
    c = float(row[1]) if observed and row[1] is not None else concurrency
    if service_s is None or not c:
        return Capacity(target_qps, service_s, c, observed, None, None, None, headroom)
    in_flight = target_qps * service_s
    n = math.ceil(in_flight / c - 1e-9)
    return Capacity(target_qps, service_s, c, observed, in_flight, n,
                    math.ceil(n * (1.0 + headroom) - 1e-9), headroom)


# --------------------------------------------------------------------------------------------
# summary_text
# --------------------------------------------------------------------------------------------
_SUMMARY_SQL = "select * from slo_summary order by run_id nulls first"
_CAUSES_SQL = """
select run_id, cause, count(*) as requests, sum(excess_ms) as excess_ms
from slow_requests
group by all
order by run_id nulls first, requests desc, cause
"""


def summary_text(reader: Reads, slo: SLO | None = None) -> str:
    """A few lines per run for the CLI: requests, goodput, failures, percentiles, causes."""
    runs = reader.query(_SUMMARY_SQL, slo=slo)
    causes = reader.query(_CAUSES_SQL, slo=slo)
    if runs.height == 0:
        return "no requests in the store"
    lines: list[str] = []
    for r in runs.iter_rows(named=True):
        name = r["run_id"] if r["run_id"] is not None else "(no run)"
        lines.append(
            f"run {name}: {r['requests']} requests, {r['ok']} ok, {r['slow']} slow, "
            f"goodput {r['goodput']} ({_pct(r['attainment'])} attainment, "
            f"{_num(r['goodput_rps'], '.2f')} req/s) at TTFT<={r['ttft_slo_ms']:.0f} ms, "
            f"TPOT<={r['tpot_slo_ms']:.0f} ms"
        )
        seen_by = ", ".join(
            f"{side} {r[f'{side}_failures']}" for side in ("client", "router", "replica")
            if r.get(f"{side}_failures")
        )
        lines.append(
            f"  failures: {r['timeouts']} timeout, {r['rejected']} rejected, "
            f"{r['errors']} error, {r['cancelled']} cancelled"
            + (f" (seen by {seen_by})" if seen_by else "")
        )
        lines.append(
            f"  TTFT p50/p90/p99 {_num(r['ttft_p50_ms'])}/{_num(r['ttft_p90_ms'])}/"
            f"{_num(r['ttft_p99_ms'])} ms; TPOT p50/p90/p99 {_num(r['tpot_p50_ms'], '.1f')}/"
            f"{_num(r['tpot_p90_ms'], '.1f')}/{_num(r['tpot_p99_ms'], '.1f')} ms"
        )
        run_causes = causes.filter(
            pl.col("run_id").is_null() if r["run_id"] is None else pl.col("run_id") == r["run_id"]
        )
        if run_causes.height:
            lines.append("  slow by primary cause: " + ", ".join(
                f"{c['cause']} {c['requests']} ({_num(c['excess_ms'])} ms)"
                for c in run_causes.iter_rows(named=True)
            ))
    return "\n".join(lines)


def _num(x: Any, fmt: str = ".0f") -> str:
    return "-" if x is None else format(float(x), fmt)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100.0 * float(x):.1f}%"
