"""Attribution accuracy against the testbed's ground truth (docs/attribution.md, "Accuracy").

For each scenario: replay it through the real path (OTel SDK -> OTLP/HTTP -> collector ->
DuckDB store), refresh the relations, take the audit's primary cause per request from
``attributions`` (a request without a row = ``none``) and join it, on ``request_id``, to the
ground truth the testbed wrote from its own state (``primary_cause``, ``slow``). Prints, per
scenario and overall: counts, slow agreement, per-cause precision / recall / support of the
primary cause, the confusion matrix, the time taken, and the determinism check (each store
rebuilt from its raw rows in another order, in three batches, on one thread: primary verdicts
that differ; ``--no-determinism`` skips it).

    python3 benchmarks/attribution_accuracy.py [--requests 1000] [--seed 0]
        [--scenarios baseline,mixed] [--workdir DIR] [--reuse] [--ttft-slo-ms MS] [--wrong N]

Like with like:
* One principle. Both sides size every cause as a counterfactual saving (how much lower the
  TTFT would have been without it) and take the largest as primary (docs/attribution.md,
  docs/testbed.md).
* SLO. The testbed labels a request slow when its TTFT (arrival -> first token) exceeds
  ``LabelConfig.ttft_slo_ms`` and ignores TPOT; a request cancelled before its first token is
  slow; long_prompt is the part of the ideal TTFT above that SLO. The benchmark SLO is the
  scenario's ``LabelConfig.ttft_slo_ms`` (2000 ms for every scenario) unless ``--ttft-slo-ms``
  says otherwise; it is printed per scenario. The ground truth is labelled with it (the
  simulation is re-run in-process without an emitter: it is deterministic, so its request ids
  and TTFTs are those of the replayed store) and the audit reads it from session variables
  (``routeaudit_ttft_slo_ms``; ``routeaudit_tpot_slo_ms`` = +inf, no TPOT target), so both
  sides call the same requests slow and size long_prompt the same way. Why 2000 ms: on the
  Mooncake trace (TTFT p50 ~0.9 s) it is the SLO with the most fault-primary requests in every
  scenario; higher SLOs shrink every fault's support (stale_telemetry in its own scenario: ~83
  at 2 s, 51 at 3 s, 22 at 5 s) while long prompts no longer swamp a 2 s SLO because only
  their part above it is charged.
* Causes. The ground truth knows misrouting, eviction, stale_telemetry (sub-cause herding),
  overload, slow_replica, long_prompt, none. The audit's stale_telemetry (sub-kind herding or
  stale_view) is compared as stale_telemetry; its ``unknown`` (slow, complete trace, no cause
  significant) is the ground truth's ``none`` for a slow request; ``incomplete_trace`` and
  ``client_network`` stay as they are (they can only count against its recall).
* ``--reuse`` keeps the stores in ``--workdir`` and replays only what is missing: after a
  change to the SQL, opening the store rebuilds the relations; the ground truth is always
  relabelled with the current rules and SLO.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

DEFAULT_SCENARIOS = ("baseline", "stale_telemetry", "herding", "eviction_pressure",
                     "load_blind_cache", "slow_replica", "overload_bursts", "mixed",
                     "draining_polls", "no_pending_correction", "partial_prefix_index",
                     "last_replica_prefix_index", "ties")
GT_CAUSES = ("misrouting", "eviction", "stale_telemetry", "overload", "slow_replica",
             "long_prompt", "none")
FOCUS = tuple(c for c in GT_CAUSES if c != "none")
"""Causes the goal is set on: every cause, per scenario (precision >= 0.95, recall >= 0.9)."""
TARGET_PRECISION = 0.95
TARGET_RECALL = 0.9


# --------------------------------------------------------------------------------------------
# SLO alignment
# --------------------------------------------------------------------------------------------
def aligned_slo(scenario: str, ttft_slo_ms: float | None = None) -> Any:
    """The audit SLO the ground truth of ``scenario`` is labelled with (no TPOT target)."""
    from audit import SLO

    if ttft_slo_ms is None:
        ttft_slo_ms = float(label_config(scenario).ttft_slo_ms)
    return SLO(ttft_ms=float(ttft_slo_ms), tpot_ms=math.inf)


def label_config(scenario: str) -> Any:
    """The scenario's LabelConfig (scenarios may change the fleet; labels come with it)."""
    import testbed

    sim = testbed.prepare_scenario(scenario, n_requests=1, progress=False)
    return sim.cfg.labels


# --------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------
def replay(scenario: str, workdir: Path, n_requests: int, seed: int, reuse: bool
           ) -> tuple[Path, Path, float]:
    from routeaudit._demo import replay_into_store

    db = workdir / f"{scenario}.duckdb"
    gt = workdir / f"{scenario}.groundtruth.jsonl"
    meta = workdir / f"{scenario}.meta.json"
    want = {"scenario": scenario, "requests": n_requests, "seed": seed}
    if reuse and db.exists() and gt.exists() and meta.exists():
        if json.loads(meta.read_text()) == want:
            return db, gt, 0.0
    for p in (db, Path(f"{db}.wal"), gt, meta):
        p.unlink(missing_ok=True)
    t = time.perf_counter()
    replay_into_store(db, [(scenario, None)], n_requests=n_requests, seed=seed, progress=False,
                      ground_truth=gt)
    elapsed = time.perf_counter() - t
    meta.write_text(json.dumps(want))
    return db, gt, elapsed


def relabel(scenario: str, gt: Path, n_requests: int, seed: int, ttft_slo_ms: float) -> None:
    """Write the ground truth of ``scenario`` labelled with the current rules and
    ``ttft_slo_ms``: the simulation is re-run without an emitter (deterministic: same request
    ids, same TTFTs as the replayed store); only the labels depend on the SLO."""
    import testbed
    from testbed._groundtruth import write_ground_truth

    sim = testbed.prepare_scenario(scenario, seed=seed, n_requests=n_requests, progress=False)
    sim.cfg = dataclasses.replace(
        sim.cfg, labels=dataclasses.replace(sim.cfg.labels, ttft_slo_ms=float(ttft_slo_ms)))
    sim.run()
    write_ground_truth(sim.ground_truth_rows(), gt)


def audit_primary(db: Path, slo: Any) -> tuple[pl.DataFrame, float, float]:
    """(request_id, audit_cause, audit_sub_kind, audit_slow) per request; refresh and query s."""
    from audit._store import Store

    t = time.perf_counter()
    store = Store(db)  # rebuilds the relations when the SQL changed since the last refresh
    try:
        store.refresh()
        refresh_s = time.perf_counter() - t
        t = time.perf_counter()
        table = store.query_arrow(
            """
            select
                r.request_id,
                a.cause as audit_cause,
                a.sub_kind as audit_sub_kind,
                a.excess_ms as audit_excess_ms,
                a.evidence as audit_evidence,
                j.needs_attribution as audit_slow
            from requests as r
            left join int_attr_requests_judged as j using (request_key)
            left join attributions as a
                on a.request_key = r.request_key and a.is_primary
            """,
            variables=slo.variables(),
        )
        query_s = time.perf_counter() - t
    finally:
        store.close()
    return pl.from_arrow(table), refresh_s, query_s  # type: ignore[return-value]


VERDICT_SQL = """
    select request_key, cause, sub_kind, excess_ms, confidence, evidence
    from attributions where is_primary order by all
"""


def determinism(db: Path, slo: Any, seed: int) -> tuple[int, int]:
    """(verdicts that differ, verdicts) between ``db`` and an identical store built again from
    its raw rows in another order, in three batches, on one thread."""
    import random

    import pyarrow as pa
    import pyarrow.compute as pc

    from audit._store import Store

    src = Store(db)
    try:
        src.refresh()
        spans = src.query_arrow("select * from raw_spans")
        events = src.query_arrow("select * from raw_span_events")
        snaps = src.query_arrow("select * from raw_snapshots")
        want = src.query_arrow(VERDICT_SQL, variables=slo.variables()).to_pylist()
    finally:
        src.close()
    order = list(range(spans.num_rows))
    random.Random(seed).shuffle(order)
    spans = spans.take(pa.array(order, type=pa.int64()))
    copy = db.with_name(db.stem + ".determinism.duckdb")
    for p in (copy, Path(f"{copy}.wal")):
        p.unlink(missing_ok=True)
    store = Store(copy, threads=1, incremental=False)
    try:
        n = spans.num_rows
        for k in range(3):
            part = spans.slice(k * n // 3, (k + 1) * n // 3 - k * n // 3)
            ids = part.column("span_id")
            store.append(spans=part, events=events.filter(pc.is_in(events["span_id"], ids)),
                         snapshots=snaps if k == 0 else None)
        store.refresh()
        got = store.query_arrow(VERDICT_SQL, variables=slo.variables()).to_pylist()
    finally:
        store.close()
        for p in (copy, Path(f"{copy}.wal")):
            p.unlink(missing_ok=True)
    differ = len({tuple(r.values()) for r in want} ^ {tuple(r.values()) for r in got})
    return differ, len(want)


def load_truth(path: Path) -> pl.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pl.DataFrame(
        [{"request_id": r["request_id"], "gt_cause": r["primary_cause"], "gt_slow": r["slow"],
          "gt_subcause": r.get("stale_subcause"), "gt_outcome": r["outcome"],
          "gt_ttft_ms": r.get("actual_ttft_ms"),
          **{f"gt_ms_{c}": r.get(f"cause_ms_{c}") for c in GT_CAUSES if c != "none"}}
         for r in rows],
        schema={"request_id": pl.Utf8, "gt_cause": pl.Utf8, "gt_slow": pl.Boolean,
                "gt_subcause": pl.Utf8, "gt_outcome": pl.Utf8, "gt_ttft_ms": pl.Float64,
                **{f"gt_ms_{c}": pl.Float64 for c in GT_CAUSES if c != "none"}},
    )


def joined(audit: pl.DataFrame, truth: pl.DataFrame) -> pl.DataFrame:
    df = truth.join(audit, on="request_id", how="left")
    return df.with_columns(
        pl.col("audit_cause").fill_null("none"),
        pl.col("audit_slow").fill_null(False),
        pl.col("audit_cause").is_null().alias("audit_no_row"),
    ).with_columns(
        # herding is a kind of stale telemetry on both sides
        pl.when(pl.col("audit_cause") == "herding").then(pl.lit("stale_telemetry"))
        # 'unknown' = slow, complete trace, no cause significant: the ground truth's 'none'
        .when(pl.col("audit_cause") == "unknown").then(pl.lit("none"))
        .otherwise(pl.col("audit_cause")).alias("audit_cause"),
    )


# --------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------
def scores(df: pl.DataFrame) -> pl.DataFrame:
    rows = []
    causes = sorted(set(df["gt_cause"].unique()) | set(df["audit_cause"].unique()),
                    key=lambda c: (c not in GT_CAUSES, GT_CAUSES.index(c) if c in GT_CAUSES else 0, c))
    for c in causes:
        if c == "none":
            continue
        tp = df.filter((pl.col("gt_cause") == c) & (pl.col("audit_cause") == c)).height
        predicted = df.filter(pl.col("audit_cause") == c).height
        actual = df.filter(pl.col("gt_cause") == c).height
        rows.append({
            "cause": c, "truth": actual, "audit": predicted, "both": tp,
            "precision": tp / predicted if predicted else None,
            "recall": tp / actual if actual else None,
        })
    return pl.DataFrame(rows, schema={"cause": pl.Utf8, "truth": pl.Int64, "audit": pl.Int64,
                                      "both": pl.Int64, "precision": pl.Float64,
                                      "recall": pl.Float64})


def confusion(df: pl.DataFrame) -> pl.DataFrame:
    audit_causes = sorted(df["audit_cause"].unique().to_list())
    return (df.group_by("gt_cause", "audit_cause").len()
            .pivot(on="audit_cause", index="gt_cause", values="len")
            .fill_null(0)
            .select(["gt_cause", *[c for c in audit_causes]])
            .sort("gt_cause"))


def wrong_verdicts(df: pl.DataFrame, per_pair: int) -> list[str]:
    """The confusion pairs (truth primary != audit primary), most frequent first, each with the
    evidence text of up to ``per_pair`` of its requests and the ground truth's saving per
    cause: where the largest errors come from."""
    wrong = df.filter(pl.col("gt_cause") != pl.col("audit_cause"))
    if wrong.is_empty():
        return []
    out = ["  wrong verdicts (truth -> audit: count; examples with evidence)"]
    pairs = (wrong.group_by("gt_cause", "audit_cause").len()
             .sort(["len", "gt_cause", "audit_cause"], descending=[True, False, False]))
    gt_ms = [c for c in df.columns if c.startswith("gt_ms_")]
    for pair in pairs.iter_rows(named=True):
        out.append(f"    {pair['gt_cause']} -> {pair['audit_cause']}: {pair['len']}")
        examples = (wrong.filter((pl.col("gt_cause") == pair["gt_cause"])
                                 & (pl.col("audit_cause") == pair["audit_cause"]))
                    .sort("request_id").head(per_pair))
        for r in examples.iter_rows(named=True):
            truth = ", ".join(f"{c[6:]} {r[c]:.0f}" for c in gt_ms if r[c])
            out.append(f"      {r['request_id']} ttft {r['gt_ttft_ms'] or 0:.0f} ms; truth "
                       f"[{truth}]; audit {r['audit_sub_kind'] or ''}: "
                       f"{r['audit_evidence'] or '(no row)'}")
    return out


def _fmt(x: Any) -> str:
    return "   -" if x is None else f"{x:5.2f}"


def report(name: str, df: pl.DataFrame, timings: dict[str, float]) -> list[str]:
    out = [f"== {name}: {df.height} requests; truth slow {df['gt_slow'].sum()}, "
           f"audit slow {df['audit_slow'].sum()}, both {(df['gt_slow'] & df['audit_slow']).sum()}; "
           + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())]
    s = scores(df)
    out.append(f"  {'cause':<16}{'truth':>6}{'audit':>6}{'both':>6}  prec  recall")
    for r in s.iter_rows(named=True):
        flag = ""
        if r["cause"] in FOCUS:
            ok_p = r["precision"] is None or r["precision"] >= TARGET_PRECISION
            ok_r = r["recall"] is None or r["recall"] >= TARGET_RECALL
            flag = "" if (ok_p and ok_r) else "   <- below goal"
        out.append(f"  {r['cause']:<16}{r['truth']:>6}{r['audit']:>6}{r['both']:>6} "
                   f"{_fmt(r['precision'])} {_fmt(r['recall'])}{flag}")
    cm = confusion(df)
    cols = cm.columns[1:]
    out.append("  confusion (rows: truth primary, columns: audit primary)")
    out.append("  " + f"{'':<16}" + "".join(f"{c[:10]:>11}" for c in cols))
    for r in cm.iter_rows(named=True):
        out.append("  " + f"{r['gt_cause']:<16}" + "".join(f"{r[c]:>11}" for c in cols))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests per scenario")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS))
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where stores and ground truth go (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse stores in --workdir made with the same scenario/requests/seed")
    ap.add_argument("--ttft-slo-ms", type=float, default=None,
                    help="TTFT SLO for both sides (default: the scenario's LabelConfig, 2000)")
    ap.add_argument("--no-determinism", action="store_true",
                    help="skip rebuilding each store from its raw rows in another order to "
                         "compare every primary verdict")
    ap.add_argument("--wrong", type=int, default=0, metavar="N",
                    help="print every confusion pair per scenario with the evidence of up to N "
                         "of its requests")
    ap.add_argument("--dump", type=Path, default=None,
                    help="write the joined per-request rows (all scenarios) to this Parquet file")
    args = ap.parse_args(argv)

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    tmp = None
    workdir = args.workdir
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="routeaudit-accuracy-")
        workdir = Path(tmp)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    frames = []
    unstable = 0
    lines: list[str] = []
    try:
        for scenario in scenarios:
            slo = aligned_slo(scenario, args.ttft_slo_ms)
            db, gt, replay_s = replay(scenario, workdir, args.requests, args.seed, args.reuse)
            t = time.perf_counter()
            relabel(scenario, gt, args.requests, args.seed, slo.ttft_ms)
            replay_s += time.perf_counter() - t
            audit, refresh_s, query_s = audit_primary(db, slo)
            df = joined(audit, load_truth(gt)).with_columns(pl.lit(scenario).alias("scenario"))
            frames.append(df)
            timings = {"replay": replay_s, "refresh": refresh_s, "query": query_s}
            block = report(f"{scenario} (TTFT SLO {slo.ttft_ms:.0f} ms, no TPOT target)",
                           df, timings)
            if args.wrong:
                block.extend(wrong_verdicts(df, args.wrong))
            if not args.no_determinism:
                differ, total_verdicts = determinism(db, slo, args.seed)
                unstable += differ
                block.append(f"  determinism: {differ} of {total_verdicts} primary verdicts "
                             "differ in a store rebuilt in another order, batches, threads")
            print("\n".join(block), flush=True)
            lines.extend(block)
        everything = pl.concat(frames)
        total = time.perf_counter() - started
        print("\n".join(report("overall", everything, {"total": total})))
        if not args.no_determinism:
            print(f"  determinism: {unstable} primary verdicts differ between identical stores")
        if args.dump is not None:
            everything.write_parquet(args.dump)
        # goal check on the focus causes, per scenario
        misses = []
        for scenario, df in zip(scenarios, frames, strict=True):
            for r in scores(df).iter_rows(named=True):
                if r["cause"] not in FOCUS:
                    continue
                if r["precision"] is not None and r["precision"] < TARGET_PRECISION:
                    misses.append(f"{scenario}/{r['cause']} precision {r['precision']:.2f}")
                if r["recall"] is not None and r["recall"] < TARGET_RECALL:
                    misses.append(f"{scenario}/{r['cause']} recall {r['recall']:.2f}")
        print(f"\ngoal (precision >= {TARGET_PRECISION}, recall >= {TARGET_RECALL} for "
              f"{', '.join(FOCUS)}): " + ("met" if not misses else f"{len(misses)} misses: "
                                          + "; ".join(misses)))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
