"""The declared-score replay (docs/attribution.md, "A declared score replayed"), measured.

Two measurements, each printed:

* ``--renamed``: on the stores of ``benchmarks/attribution_accuracy.py --workdir DIR`` (one
  ``<scenario>.duckdb`` per scenario), every router's policy is renamed in the attribution (a
  session view over ``int_attr_requests_placed`` in which the policy name gets a prefix), so
  that only the scores its router recorded say what it does. Per store: decisions whose score
  is replayed, what it is replayed as, and how many primary verdicts differ from the named
  policy's replay and from no replay at all (the score replay's ``policy_true_*`` set to
  null, which is how an unknown policy is judged without it).
* ``--custom SCENARIOS``: testbed scenarios run (through the real OTLP path, as the accuracy
  benchmark does) with a router policy the audit does not know, ``fewest_in_flight``: the
  fewest requests as seen (waiting + running + pending), its score that count. Per scenario:
  primary cause against the ground truth, with and without the score replay.

    python3 benchmarks/declared_score_replay.py --workdir DIR [--renamed]
        [--custom stale_telemetry,draining_polls] [--requests 1000] [--seed 0]

Stores are refreshed (rebuilt when the SQL changed) before they are read; the session views
are not stored.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402
import polars as pl  # noqa: E402

PLACED = "int_attr_requests_placed"
POLICY_NAME = "any_value(lower(f.decision_policy)) as policy_name"
RENAMED = "any_value('unnamed_' || lower(f.decision_policy)) as policy_name"
REPLAYED_COLUMNS = ("policy_true_replica", "policy_true_ttft_est_ms", "policy_true_wait_est_ms",
                    "policy_true_seen_load", "policy_true_true_load",
                    "policy_true_router_est_queue_ms")
PRIMARY = """
    select r.request_id, a.cause as audit_cause, a.sub_kind as audit_sub_kind,
        a.excess_ms as audit_excess_ms, a.evidence as audit_evidence,
        j.needs_attribution as audit_slow
    from requests as r
    left join int_attr_requests_judged as j using (request_key)
    left join attributions as a on a.request_key = r.request_key and a.is_primary
"""
CAUSES = ("misrouting", "stale_telemetry", "overload", "long_prompt", "eviction")


def accuracy_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "attribution_accuracy", ROOT / "benchmarks" / "attribution_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def variants() -> dict[str, str]:
    """The relation's SQL: as stored, with its policies renamed, and renamed without the
    score replay."""
    from audit import _relations

    (rel,) = [r for r in _relations.load_relations() if r.name == PLACED]
    sql = rel.sql.strip().rstrip(";")
    if POLICY_NAME not in sql:
        raise SystemExit(f"{PLACED}.sql no longer names its policy as {POLICY_NAME!r}")
    renamed = sql.replace(POLICY_NAME, RENAMED)
    nulls = ", ".join(f"case when policy_score_replayed_as is null then {c} end as {c}"
                      for c in REPLAYED_COLUMNS)
    return {"named": sql, "score replay": renamed,
            "no score replay": f"select * replace ({nulls}) from ({renamed})"}


def refreshed(db: Path) -> None:
    from audit._store import Store

    store = Store(db)
    try:
        store.refresh()
    finally:
        store.close()


def connect(db: Path, slo: Any) -> duckdb.DuckDBPyConnection:
    from audit._store import _tune

    con = duckdb.connect(str(db))
    _tune(con)
    for name, value in slo.variables().items():
        con.execute(f"set variable {name} = ?::double", [float(value)])
    return con


def primaries(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    con.execute(f"create or replace temp view {PLACED} as {sql}")
    return pl.from_arrow(con.sql(PRIMARY).to_arrow_table())  # type: ignore[return-value]


def renamed(workdir: Path, scenarios: Sequence[str]) -> None:
    acc = accuracy_module()
    sqls = variants()
    for scenario in scenarios:
        db = workdir / f"{scenario}.duckdb"
        if not db.exists():
            print(f"== {scenario}: no store in {workdir}")
            continue
        refreshed(db)
        con = connect(db, acc.aligned_slo(scenario))
        try:
            verdicts = {}
            for label, sql in sqls.items():
                df = primaries(con, sql).filter(pl.col("audit_cause").is_not_null())
                verdicts[label] = dict(zip(df["request_id"],
                                           (df["audit_cause"] + "/" +
                                            df["audit_sub_kind"].fill_null("")), strict=True))
            con.execute(f"create or replace temp view {PLACED} as {sqls['score replay']}")
            policy, decisions, replayed = con.execute(
                f"select any_value(decision_policy), count(decision_policy), "
                f"count(policy_score_replayed_as) from {PLACED}").fetchall()[0]
            top = con.execute(
                f"select coalesce(policy_score_replayed_as, policy_score_not_replayed), "
                f"count(*) from {PLACED} where decision_policy is not null "
                f"group by 1 order by 2 desc, 1 limit 3").fetchall()
        finally:
            con.close()
        named, replay, none = (verdicts["named"], verdicts["score replay"],
                               verdicts["no score replay"])
        keys = named.keys() | replay.keys() | none.keys()

        def differ(a: dict[str, str], b: dict[str, str]) -> int:
            return sum(a.get(k) != b.get(k) for k in keys)  # noqa: B023

        print(f"== {scenario} ({policy} renamed): {replayed} of {decisions} decisions "
              f"replayed; primary verdicts {len(named)}: differ from the named replay "
              f"{differ(replay, named)} (without the score replay {differ(none, named)})")
        for what, n in top:
            print(f"   {n:5d}  {what}")


class FewestInFlight:
    """The fewest requests as seen (waiting + running + pending), ties to the replica listed
    first; its score is that count."""

    name = "fewest_in_flight"
    uses_prefix = False

    def decide(self, req: Any, cands: Sequence[Any], rng: random.Random) -> Any:
        from testbed.policies import Choice

        eligible = [c for c in cands if c.eligible]
        if not eligible:
            return Choice(None, "no_eligible_replica")
        best = min(eligible, key=lambda c: (c.load, c.index))
        return Choice(best.index, "fewest_in_flight", tuple(float(c.load) for c in cands))

    def commit(self, choice: Any) -> None:
        pass


def custom(workdir: Path, scenarios: Sequence[str], n_requests: int, seed: int) -> None:
    from routeaudit._demo import replay_into_store
    from testbed.policies import POLICIES, register_policy

    if FewestInFlight.name not in POLICIES:
        register_policy(FewestInFlight.name)(lambda cfg, cost, mbt: FewestInFlight())
    acc = accuracy_module()
    sqls = variants()
    for scenario in scenarios:
        db = workdir / f"{scenario}.{FewestInFlight.name}.duckdb"
        gt = workdir / f"{scenario}.{FewestInFlight.name}.groundtruth.jsonl"
        for p in (db, Path(f"{db}.wal"), gt):
            p.unlink(missing_ok=True)
        replay_into_store(db, [(scenario, FewestInFlight.name)], n_requests=n_requests,
                          seed=seed, progress=False, ground_truth=gt)
        refreshed(db)
        truth = acc.load_truth(gt)
        con = connect(db, acc.aligned_slo(scenario))
        try:
            for label in ("score replay", "no score replay"):
                df = acc.joined(primaries(con, sqls[label].replace(RENAMED, POLICY_NAME)),
                                truth)
                slow = df.filter(pl.col("gt_slow"))
                agree = slow.filter(pl.col("gt_cause") == pl.col("audit_cause")).height
                print(f"== {scenario}, {FewestInFlight.name} router, {label}: primary cause "
                      f"matches the ground truth for {agree} of {slow.height} slow requests")
                for row in acc.scores(df).filter(pl.col("cause").is_in(CAUSES)).iter_rows(
                        named=True):
                    print(f"   {row['cause']:16s} precision {acc._fmt(row['precision'])} "
                          f"recall {acc._fmt(row['recall'])} support {row['truth']}")
        finally:
            con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--renamed", action="store_true")
    ap.add_argument("--scenarios", default=",".join(accuracy_module().DEFAULT_SCENARIOS),
                    help="stores read by --renamed")
    ap.add_argument("--custom", default="", help="scenarios run with a fewest_in_flight router")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.renamed:
        renamed(args.workdir, [s for s in args.scenarios.split(",") if s])
    if args.custom:
        custom(args.workdir, [s for s in args.custom.split(",") if s], args.requests,
               args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
