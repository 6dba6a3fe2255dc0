"""Make a store with closed partitions hold N times its history, for the dashboard benchmark
(measure only): copies of its closed partitions laid end to end before them in event time.

Copy k (1..N) of the closed partitions ``[lo, hi)`` becomes partitions ``[lo − k·P, hi − k·P)``,
``P = hi − lo``: every instant in it (timestamp columns and Unix-ns columns) moves back by k·P
partition widths, and every identifier of a request, trace, span, decision or run gets a suffix
of its copy, so no copy's rows join another's. Replica, router and host ids stay: the copies are
more history of the same fleet. Nested values (candidate lists, evidence text) are copied as they
are. The DuckDB file keeps its rows: its open partitions stay the newest, and the copies lie
below ``closed_until``, so every reader reads them with the rest. Only its per-partition
summaries of closed requests (``_closed.SUMMARY_TABLE``) are dropped, as they would leave the
copies out of the store's range; the next close writes them again over every partition.

A store of 60,000 closed requests tiled 165 times holds about 10M requests; the dashboard's
default window (the last hour) still holds only the newest traffic, so what the page time
gains over the untiled store is what the history costs a page that should not read it.

    python3 benchmarks/tile_history.py --db STORE --copies 165      # then dashboard_speed.py --db STORE

Work on a copy of a store you want to keep: the tiles cannot be told from real partitions.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audit import _closed, _incremental  # noqa: E402

FLEET_IDS = ("router", "replica", "service", "instance", "host", "model", "pool", "engine_id")
"""Identifier columns naming a part of the fleet, kept as they are in every copy."""

NOT_INSTANTS = ("offset", "duration", "lag", "age", "delay", "gap", "_ms")
"""Unix-ns-looking columns that hold a length of time, not an instant."""


def _is_id(name: str, typ: str) -> bool:
    return (typ == "VARCHAR" and (name.endswith("_id") or name.endswith("_key"))
            and not any(f in name for f in FLEET_IDS))


def _is_instant_ns(name: str, typ: str) -> bool:
    return (typ in ("BIGINT", "HUGEINT") and name.endswith("_ns")
            and not any(n in name for n in NOT_INSTANTS))


def tiled_select(columns: list[tuple[str, str]], glob: str | list[str], lo: int, hi: int,
                 width_ns: int, k: int) -> tuple[str, dict[str, str]]:
    """The rows of copy ``k`` of partitions [lo, hi) and how each column was changed."""
    shift_ns = k * (hi - lo) * width_ns
    exprs: list[str] = []
    changed: dict[str, str] = {}
    for name, typ in columns:
        q = f'"{name}"'
        if name == "part":
            continue
        if typ.startswith("TIMESTAMP"):
            exprs.append(f"{q} - to_microseconds({shift_ns // 1000}) as {q}")
            changed[name] = "instant"
        elif _is_instant_ns(name, typ):
            exprs.append(f"{q} - {shift_ns} as {q}")
            changed[name] = "instant"
        elif _is_id(name, typ):
            exprs.append(f"{q} || '~{k}' as {q}")
            changed[name] = "id"
        elif typ == "HUGEINT" and name.endswith("_key"):
            exprs.append(f"{q} + (cast({k} as hugeint) << 110) as {q}")
            changed[name] = "id"
        else:
            exprs.append(q)
    exprs.append(f"part - {k * (hi - lo)} as part")
    files = repr(glob) if isinstance(glob, list) else f"'{glob}'"
    sql = (f"select {', '.join(exprs)} from read_parquet({files}, hive_partitioning = true) "
           f"where part >= {lo} and part < {hi}")
    return sql, changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="a store with closed partitions (no collector on it)")
    ap.add_argument("--copies", type=int, required=True, help="copies of the closed partitions laid before them")
    ap.add_argument("--link-after", type=int, metavar="K", default=None,
                    help="copies after the K-th are hard links to the original partitions' files "
                         "(rows neither shifted nor renamed): the partition count of --copies in "
                         "seconds, for timing reads that should skip them; their answers count "
                         "the original rows again")
    ap.add_argument("--dry-run", action="store_true", help="print what each table's copy changes, write nothing")
    args = ap.parse_args(argv)
    if args.copies < 1:
        ap.error("--copies must be at least 1")
    con = duckdb.connect(args.db, read_only=True)
    until = _closed.closed_until(con)
    if until is None:
        ap.error(f"{args.db} has no closed partitions")
    width_ns = _incremental.Partitioning.read(con).partition_ns
    root = _closed.folder(args.db)
    tables = [t for t in sorted(p.name for p in root.iterdir() if p.is_dir())
              if any((root / t).glob("part=*/*.parquet"))]
    con.close()
    work = duckdb.connect()
    total_rows = 0
    started = time.perf_counter()
    for table in tables:
        glob = f"{root / table}/part=*/*.parquet"
        parts = [int(p.name.split("=", 1)[1]) for p in (root / table).glob("part=*")]
        lo, hi = min(parts), max(parts) + 1
        hi = min(hi, until)
        columns = [(str(r[0]), str(r[1])) for r in work.execute(
            f"describe select * from read_parquet('{glob}', hive_partitioning = true)").fetchall()]
        rows = work.execute(f"select count(*) from read_parquet('{glob}', hive_partitioning = true) "
                            f"where part >= {lo} and part < {hi}").fetchall()[0][0]
        _, changed = tiled_select(columns, glob, lo, hi, width_ns, 1)
        print(f"{table}: partitions {lo}..{hi - 1}, {rows:,} rows; instants "
              f"{[c for c, how in changed.items() if how == 'instant']}, ids "
              f"{[c for c, how in changed.items() if how == 'id']}", flush=True)
        if args.dry_run:
            continue
        t = time.perf_counter()
        # the original partitions' files only: a glob would list every copy made so far
        originals = sorted(str(f) for p in range(lo, hi)
                           for f in (root / table / f"part={p}").glob("*.parquet"))
        shifted = args.copies if args.link_after is None else min(args.copies, args.link_after)
        for k in range(1, shifted + 1):
            sql, _ = tiled_select(columns, originals, lo, hi, width_ns, k)
            # one statement per copy: each partition gets one file, as a close writes it
            work.execute(f"copy ({sql}) to '{root / table}' (format parquet, compression "
                         f"{_closed.COMPRESSION}, compression_level {_closed.COMPRESSION_LEVEL}, "
                         "partition_by (part), overwrite_or_ignore, "
                         "filename_pattern 'data_{i}')")
        for k in range(shifted + 1, args.copies + 1):
            for f in map(Path, originals):
                target = root / table / f"part={int(f.parent.name[5:]) - k * (hi - lo)}"
                target.mkdir(exist_ok=True)
                os.link(f, target / f.name)
        total_rows += rows * args.copies
        print(f"  {args.copies} copies in {time.perf_counter() - t:.1f} s", flush=True)
    print(f"wrote {total_rows:,} rows in {time.perf_counter() - started:.1f} s")
    if not args.dry_run:
        # the per-partition summaries know only the original partitions: without them readers
        # count the requests of every partition, and the next close writes them all again
        con = duckdb.connect(args.db)
        con.execute(f"drop table if exists {_closed.SUMMARY_TABLE}")
        con.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
