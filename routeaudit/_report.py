"""Plain-text reports the command line prints (the numbers come from ``audit.attribution``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:  # pragma: no cover
    from audit.attribution import Capacity, RunComparison


def _fmt(value: Any, spec: str = ".0f", unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:{spec}}{unit}"


def format_comparison(cmp: RunComparison) -> str:
    """``routeaudit compare``: the two runs side by side, failures apart, and the TTFT test."""
    rows = {r["role"]: r for r in cmp.runs.iter_rows(named=True)}
    base, cand = rows.get("baseline", {}), rows.get("candidate", {})
    w = max(16, len(str(base.get("run_id"))) + 2, len(str(cand.get("run_id"))) + 2)
    lines = [f"{'':24s}{'baseline':>{w}s}{'candidate':>{w}s}",
             f"{'run':24s}{str(base.get('run_id')):>{w}s}{str(cand.get('run_id')):>{w}s}"]
    if base.get("requests") is None or cand.get("requests") is None:
        missing = [r for r in (base, cand) if r.get("requests") is None]
        return "\n".join(lines + [f"no requests for run {m.get('run_id')!r}" for m in missing])
    fields = [
        ("requests", "requests", "d", ""), ("ok", "ok", "d", ""),
        ("goodput (within SLO)", "goodput", "d", ""), ("SLO attainment", "attainment", ".1%", ""),
        ("goodput rate", "goodput_rps", ".2f", " req/s"),
        ("timeouts", "timeouts", "d", ""), ("rejected", "rejected", "d", ""),
        ("errors", "errors", "d", ""), ("cancelled", "cancelled", "d", ""),
        ("TTFT p50", "ttft_p50_ms", ".0f", " ms"), ("TTFT p90", "ttft_p90_ms", ".0f", " ms"),
        ("TTFT p99", "ttft_p99_ms", ".0f", " ms"), ("TPOT p50", "tpot_p50_ms", ".1f", " ms"),
        ("TPOT p90", "tpot_p90_ms", ".1f", " ms"), ("TPOT p99", "tpot_p99_ms", ".1f", " ms"),
        ("output tokens (mean)", "output_tokens_mean", ".1f", ""),
    ]
    for label, key, spec, unit in fields:
        lines.append(f"{label:24s}{_fmt(base.get(key), spec, unit):>{w}s}"
                     f"{_fmt(cand.get(key), spec, unit):>{w}s}")
    finish = cmp.finish_reasons
    if finish.height:
        lines.append("finish reasons:")
        for run_id in (base.get("run_id"), cand.get("run_id")):
            part = finish.filter(pl.col("run_id") == run_id)
            lines.append(f"  {run_id}: " + ", ".join(
                f"{r['finish_reason']} {r['requests']}" for r in part.iter_rows(named=True)))
    t = cmp.ttft_test
    if t.get("p_value") is not None:
        verdict = "significant" if cmp.significant else "not significant"
        lines.append(
            f"TTFT, Mann-Whitney U: p = {t['p_value']:.3g} ({verdict} at 0.05); "
            f"P(candidate faster) = {t['prob_candidate_faster']:.2f} "
            f"(n = {t['n_baseline']} vs {t['n_candidate']} successful requests)")
    return "\n".join(lines)


def format_capacity(cap: Capacity) -> str:
    """``routeaudit capacity``: Little's law with the observed service time and concurrency."""
    if cap.replicas is None:
        return ("not enough data: need successful executions with durations "
                "(and --concurrency if no replica ran several requests at once)")
    source = "observed peak" if cap.concurrency_observed else "given"
    return (
        f"target {cap.target_qps:g} req/s × service time {cap.service_s:.2f} s "
        f"= {cap.in_flight:.1f} requests in flight\n"
        f"per-replica concurrency C = {cap.concurrency:g} ({source})\n"
        f"replicas N = ceil({cap.in_flight:.1f} / {cap.concurrency:g}) = {cap.replicas}; "
        f"with {cap.headroom:.0%} headroom: {cap.replicas_with_headroom}"
    )
