"""A/B a change to the SQL relations on an existing store (measure only; docs/performance.md).

Two measurements, each comparing within one run on one store:

``page``: the dashboard's slow-request page query (``audit.queries.slow_page``, all runs) at a
non-default SLO, as the store answers it (A) and with one relation replaced by the ``select`` in
``--sql`` as a temporary view of the same name (B, e.g. the ``attributions.sql`` of an older
commit for ``attributions__live``). Rounds are interleaved; the results must be equal (floats to
1e-9: parallel sums differ in the last bits).

    python3 benchmarks/sql_ab.py page --db STORE --relation attributions__live \\
        --sql <(git show HEAD~1:audit/sql/marts/attributions.sql) --rounds 5

``refresh``: one full rebuild of every relation (``audit._relations.refresh``, relation by
relation) with the SQL of the source tree ``--src`` (a checkout or ``git worktree`` of the commit
to compare), then the slowest relations. Run it once per tree on the same store.

    git worktree add /tmp/old HEAD~1
    python3 benchmarks/sql_ab.py refresh --db STORE --src /tmp/old
    python3 benchmarks/sql_ab.py refresh --db STORE --src .

``floor``: every table a refresh stores, copied as it is (``create table … as select *``, in
one transaction rolled back afterwards): what writing a refresh's results costs with nothing
computed, the least a full refresh of that store can take.

    python3 benchmarks/sql_ab.py floor --db STORE

``relations``: the named relations only, built in the order given with the SQL of each tree in
turn (``--src``, twice or more), round after round, each tree's round in a transaction rolled back
afterwards, so the store is left as it was and every tree reads the same inputs except those it
builds itself. Name the relations a change touches and the ones that read them.

    python3 benchmarks/sql_ab.py relations --db STORE --src /tmp/old --src . --rounds 3 \\
        int_attr_decisions_resolved int_attr_candidates_resolved int_attr_candidates_in_flight
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return bool(a == b)


def page(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    import duckdb

    import audit
    from audit import queries

    slo = audit.SLO(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    captured: dict[str, Any] = {}

    def capture(reader: Any, sql: str, params: Any = None, *_: Any, **__: Any) -> Any:
        captured.update(sql=sql, params=params)
        raise LookupError  # stop before running it

    real, queries._query = queries._query, capture  # type: ignore[assignment]
    try:
        queries.slow_page(audit.open(args.db), {"ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms})
    except LookupError:
        pass
    finally:
        queries._query = real  # type: ignore[assignment]
    replacement = Path(args.sql).read_text().strip().rstrip(";")

    def connect(replaced: bool) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(args.db, read_only=True)
        for name, value in slo.variables().items():
            con.execute(f"set variable {name} = ?", [value])
        if replaced:  # a temporary view shadows the stored relation of that name
            con.execute(f"create temp view {args.relation} as\n{replacement}")
        return con

    a, b = connect(False), connect(True)
    sql, params = captured["sql"], captured["params"]
    same = _close(a.execute(sql, params).fetchall(), b.execute(sql, params).fetchall())
    times: dict[str, list[float]] = {"A (store)": [], f"B ({args.sql})": []}
    for _ in range(args.rounds):
        for con, key in ((a, "A (store)"), (b, f"B ({args.sql})")):
            t = time.perf_counter()
            con.execute(sql, params).fetchall()
            times[key].append(time.perf_counter() - t)
    print(f"slow page, all runs, TTFT {args.ttft_ms:g} / TPOT {args.tpot_ms:g} ms; "
          f"results equal: {same}; load {os.getloadavg()[0]:.1f}")
    for key, ts in times.items():
        print(f"  {key:40s} median {statistics.median(ts):6.2f} s   rounds "
              + " ".join(f"{t:.2f}" for t in ts))


def refresh(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from analysis_scaling import timed_refresh  # puts this checkout first on sys.path

    src = str(Path(args.src).resolve())
    sys.path.insert(0, src)  # ... so put the tree to measure before it
    from audit import _relations

    if not _relations.__file__ or not _relations.__file__.startswith(src):
        raise SystemExit(f"audit imported from {_relations.__file__}, not from {src}")
    total, built = timed_refresh(Path(args.db))
    print(f"refresh with the SQL of {src}: {total:.1f} s; load {os.getloadavg()[0]:.1f}")
    for name, kind, s in sorted(built, key=lambda r: -r[2])[:args.top]:
        print(f"  {name:40s} {kind:12s} {s:7.2f} s")


def relations(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    import duckdb

    from audit._relations import _drop

    trees = [Path(t).resolve() for t in args.src]
    layer = {p.stem: p.parent.name for p in (ROOT / "audit" / "sql").glob("*/*.sql")}
    unknown = [n for n in args.names if n not in layer]
    if unknown:
        raise SystemExit(f"no such relation: {', '.join(unknown)}")

    def body(tree: Path, name: str) -> str:
        return (tree / "audit" / "sql" / layer[name] / f"{name}.sql").read_text().strip().rstrip(";")

    con = duckdb.connect(args.db)
    times: dict[tuple[Path, str], list[float]] = {(t, n): [] for t in trees for n in args.names}
    for _ in range(args.rounds):
        for tree in trees:
            con.execute("begin transaction")
            try:
                for name in args.names:
                    # a parametrised relation is a view in the store: built as a table here,
                    # which is what refresh() stores for the cached ones
                    _drop(con, name)
                    t = time.perf_counter()
                    con.execute(f"create table {name} as\n{body(tree, name)}")
                    times[tree, name].append(time.perf_counter() - t)
            finally:
                con.execute("rollback")
            print(f"  {str(tree):40s} " + "  ".join(
                f"{n} {times[tree, n][-1]:.2f}" for n in args.names), flush=True)
    print(f"medians over {args.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    for tree in trees:
        per = [statistics.median(times[tree, n]) for n in args.names]
        print(f"  {str(tree):40s} total {sum(per):7.2f} s  " + "  ".join(
            f"{n} {m:.2f}" for n, m in zip(args.names, per, strict=True)))


def floor(args: argparse.Namespace) -> None:
    """Copy every table a refresh stores, nothing computed: what writing its results costs."""
    sys.path.insert(0, str(ROOT))
    import resource

    import duckdb

    from audit import _relations
    from audit._store import _tune

    con = duckdb.connect(args.db)
    _tune(con)
    tables = {name for (name,) in con.execute(
        "select table_name from duckdb_tables() "
        "where database_name = current_database() and schema_name = 'main'").fetchall()}
    order = [r.name for r in _relations.load_relations()]
    names = [n for n in order if n in tables] + [
        n + _relations.CACHE_SUFFIX for n in order if n + _relations.CACHE_SUFFIX in tables]
    rows: list[tuple[str, int, int, float, float]] = []
    con.execute("begin transaction")
    try:
        for name in names:
            n, cols = con.execute(
                f"select count(*), (select count(*) from duckdb_columns() where table_name = ? "
                f"and database_name = current_database()) from {name}", [name]).fetchone() or (0, 0)
            before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            con.execute(f"create table ra_floor_{name} as select * from {name}")
            wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            rows.append((name, n, cols, wall, cpu))
    finally:
        con.execute("rollback")
        con.close()
    print(f"{len(rows)} tables, {sum(r[1] for r in rows):,} rows, "
          f"{sum(r[1] * r[2] for r in rows) / 1e6:,.0f} M cells: copied in "
          f"{sum(r[3] for r in rows):.1f} s wall, {sum(r[4] for r in rows):.1f} s CPU; "
          f"load {os.getloadavg()[0]:.1f}")
    for name, n, cols, wall, cpu in sorted(rows, key=lambda r: -r[3])[:args.top]:
        print(f"  {name:40s} {n:>11,} rows x {cols:3d}  {wall:6.2f} s wall {cpu:6.2f} s CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("page", help="A/B the slow page query with one relation replaced")
    p.add_argument("--db", required=True)
    p.add_argument("--relation", default="attributions__live")
    p.add_argument("--sql", required=True, help="file holding the replacement select")
    p.add_argument("--ttft-ms", type=float, default=200.0)
    p.add_argument("--tpot-ms", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=5)
    r = sub.add_parser("refresh", help="time a full rebuild with the SQL of a source tree")
    r.add_argument("--db", required=True)
    r.add_argument("--src", default=str(ROOT))
    r.add_argument("--top", type=int, default=12)
    q = sub.add_parser("relations", help="A/B named relations of two trees, interleaved")
    q.add_argument("--db", required=True)
    q.add_argument("--src", action="append", required=True, help="a source tree (twice or more)")
    q.add_argument("--rounds", type=int, default=3)
    q.add_argument("names", nargs="+", help="relations, in build order")
    f = sub.add_parser("floor", help="copy every table a refresh stores (rolled back)")
    f.add_argument("--db", required=True)
    f.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    {"page": page, "refresh": refresh, "relations": relations, "floor": floor}[args.what](args)


if __name__ == "__main__":
    main()
