"""Spark path scaling (measure only): every relation built by Spark SQL at ``local[1]`` and
``local[2]`` over the same partitioned raw Parquet, and by DuckDB (``audit._relations.refresh``)
over the same raw rows, at each size; optionally each public relation compared between the two.

Data: a virtual-time testbed run (``hot_prefix`` workload, 8 replicas) emitted through the real
OTel SDK and decoder into a fresh store, as ``benchmarks/analysis_scaling.py`` makes it; sizes
above ``--tile-from`` are tiled from one such run (shifted copies with their own ids). The
store's raw tables are exported with ``audit.spark.export_raw``; Spark reads only that folder.

    python3 benchmarks/spark_scaling.py --sizes 5000 20000
    python3 benchmarks/spark_scaling.py --tile-from 20000 --sizes 20000 100000 1000000
    python3 benchmarks/spark_scaling.py --sizes 20000 --compare      # also compare the relations
    python3 benchmarks/spark_scaling.py --scenario mixed --masters 'local[2]' --compare

Each Spark figure is one session's build of every relation (materialised, as ``routeaudit
spark`` does) plus the write of the public ones; the session's start (JVM, about 5 s) is
printed apart. The machine's other load is not controlled: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_store(folder: Path, n: int, tile_from: int | None, batch: int,
               scenario: str = "baseline") -> Path:
    """A store of ``n`` requests' raw rows (generated, or tiled from a generated base)."""
    from analysis_scaling import generate, tile  # type: ignore[import-not-found]

    path = folder / f"requests_{scenario}_{n}.duckdb"
    if path.exists():
        return path
    if tile_from and n > tile_from:
        base = make_store(folder, tile_from, None, batch, scenario)
        tile(base, path, n)
    else:
        t = time.perf_counter()
        generate(path, n, batch, scenario)
        print(f"[{n:>9,}] generated in {time.perf_counter() - t:.0f} s", flush=True)
    return path


def duckdb_refresh(store: Path, copy: Path) -> float:
    """Seconds for DuckDB to build every relation over a copy of ``store``."""
    import duckdb

    from audit import _relations
    from audit._store import _tune

    shutil.copyfile(store, copy)
    con = duckdb.connect(os.fspath(copy))
    _tune(con)
    t = time.perf_counter()
    _relations.refresh(con)
    seconds = time.perf_counter() - t
    con.close()
    return seconds


def spark_build(raw: Path, out: Path, master: str, java_options: str | None = None,
                driver_memory: str | None = None) -> dict[str, Any]:
    from audit import spark as routeaudit_spark

    t = time.perf_counter()
    spark = routeaudit_spark.session(master, shuffle_partitions=int(master[6:-1]) * 2,
                                     app_name=f"routeaudit-bench-{master}",
                                     java_options=java_options,
                                     driver_memory=driver_memory
                                     or routeaudit_spark.DEFAULT_DRIVER_MEMORY)
    start_s = time.perf_counter() - t
    try:
        t = time.perf_counter()
        routeaudit_spark.load_raw(spark, raw)
        built = routeaudit_spark.build(spark)
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        routeaudit_spark.write_public(spark, out, built)
        write_s = time.perf_counter() - t
    finally:
        spark.stop()
    slowest = sorted(built.seconds.items(), key=lambda kv: -kv[1])[:4]
    return {"start_s": start_s, "build_s": build_s, "write_s": write_s,
            "failed": {**built.failed, **built.skipped}, "slowest": slowest}


def compare(store: Path, out: Path) -> dict[str, str]:
    """Each public relation Spark wrote against the refreshed store's: 'equal' or why not."""
    import duckdb

    from audit import _relations
    from audit._store import _tune
    from tests.spark.test_spark_equivalence import GRAIN, JSON_COLUMNS, _norm, _same

    con = duckdb.connect(os.fspath(store), read_only=True)
    _tune(con)
    verdicts = {}
    for name in _relations.public_relations():
        folder = out / name
        if not folder.exists():
            verdicts[name] = "not written"
            continue
        cur = con.execute(f"select * from {name}")
        cols = [d[0] for d in cur.description or []]
        ref = cur.fetchall()
        cur = con.execute(f"select * from read_parquet('{folder}/**/*.parquet', "
                          "hive_partitioning = true, union_by_name = true)")
        gcols = [d[0] for d in cur.description or []]
        got = cur.fetchall()
        keys = GRAIN[name]
        want = {tuple(repr(_norm(dict(zip(cols, r, strict=True))[k])) for k in keys):
                dict(zip(cols, r, strict=True)) for r in ref}
        have = {tuple(repr(_norm(dict(zip(gcols, r, strict=True))[k])) for k in keys):
                dict(zip(gcols, r, strict=True)) for r in got}
        if len(want) < len(ref):
            # tiled copies repeat ids (a decision's across copies): the grain is not a key
            # here, so rows are compared as multisets, exactly, both ways
            select = ", ".join(f'"{c}"' for c in cols)
            spark_rows = (f"select {select} from read_parquet('{folder}/**/*.parquet', "
                          "hive_partitioning = true, union_by_name = true)")
            extra = sum(con.execute(f"select count(*) from ({a} except all {b})").fetchall()[0][0]
                        for a, b in ((spark_rows, f"select {select} from {name}"),
                                     (f"select {select} from {name}", spark_rows)))
            verdicts[name] = (f"grain not unique ({len(ref)} rows, {len(want)} keys): "
                              + ("equal as multisets" if not extra
                                 else f"{extra} rows differ as multisets"))
            continue
        if want.keys() != have.keys():
            verdicts[name] = (f"rows differ: {len(ref)} vs {len(got)}, "
                              f"{len(want.keys() - have.keys())} missing")
            continue
        for c in JSON_COLUMNS.get(name, ()):  # the same objects in other text
            for record in (*want.values(), *have.values()):
                record[c] = None if record.get(c) is None else json.loads(record[c])
        bad = sum(1 for k in want for c in cols if not _same(want[k][c], have[k].get(c)))
        verdicts[name] = "equal" if not bad else f"{bad} values differ"
    con.close()
    return verdicts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    ap.add_argument("--tile-from", type=int, default=None, metavar="B")
    ap.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--scenario", default="baseline",
                    help="testbed scenario (mixed: evictions and preemptions, slow requests)")
    ap.add_argument("--keep", type=Path, default=None, help="keep stores and outputs here")
    ap.add_argument("--compare", action="store_true", help="compare the public relations")
    ap.add_argument("--short-run-jvm", action="store_true",
                    help="the driver JVM with audit.spark.SHORT_RUN_JAVA_OPTIONS (C1 only, serial GC; "
                         "applies to the first master only: one JVM per process)")
    ap.add_argument("--driver-memory", default=None,
                    help="the driver JVM's heap, where local[N] runs every task (first master "
                         "only; default audit.spark.DEFAULT_DRIVER_MEMORY)")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="spark_scaling_"))
    folder.mkdir(parents=True, exist_ok=True)
    import duckdb

    from audit import spark as routeaudit_spark

    for n in args.sizes:
        store = make_store(folder, n, args.tile_from, args.batch, args.scenario)
        con = duckdb.connect(os.fspath(store), read_only=True)
        spans = con.execute("select count(*) from raw_spans").fetchall()[0][0]
        con.close()
        refreshed = folder / f"refreshed_{args.scenario}_{n}.duckdb"
        duck_s = duckdb_refresh(store, refreshed)
        print(f"[{n:>9,} requests, {spans:,} spans] DuckDB (every relation): {duck_s:.1f} s",
              flush=True)
        con = duckdb.connect(os.fspath(refreshed), read_only=True)
        raw = folder / f"raw_{args.scenario}_{n}"
        t = time.perf_counter()
        routeaudit_spark.export_raw(con, raw)
        con.close()
        print(f"[{n:>9,}] export to Parquet: {time.perf_counter() - t:.1f} s", flush=True)
        for master in args.masters:
            out = folder / f"out_{args.scenario}_{n}_{master[6:-1]}"
            r = spark_build(raw, out, master,
                            routeaudit_spark.SHORT_RUN_JAVA_OPTIONS if args.short_run_jvm else None,
                            args.driver_memory)
            rate = n / r["build_s"]
            print(f"[{n:>9,}] Spark {master}: build {r['build_s']:.1f} s ({rate:,.0f} requests/s), "
                  f"write {r['write_s']:.1f} s, session start {r['start_s']:.1f} s; slowest: "
                  + ", ".join(f"{k} {s:.1f} s" for k, s in r["slowest"]), flush=True)
            if r["failed"]:
                print(f"[{n:>9,}]   not built: {r['failed']}", flush=True)
            if args.compare and master == args.masters[-1]:
                for name, verdict in compare(refreshed, out).items():
                    print(f"[{n:>9,}]   {name}: {verdict}", flush=True)
    if args.keep is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
