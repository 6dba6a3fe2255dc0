"""Incremental refresh (measure only): what a refresh by slices of event time costs on a large
store of continuous traffic, against a full rebuild, and where the time goes.

The store: one virtual-time testbed run of ``--base`` requests (``hot_prefix``, 8 replicas,
8 requests/s of virtual time, through the real SDK encoder and the collector's decoder, as in
``analysis_scaling.py``) laid end to end: each copy starts ``--gap-s`` seconds after the previous
one ends, on the same replicas, with its own trace, request and run ids, so the store is hours of
continuous traffic, and a slice's windows (prefix blocks, in-flight work, windowed summaries)
reach across copies. Requests are taken in start order, so "the next 1 %" is the traffic right
after the store's newest request.

For each size it prints:

1. **backfill**: a full rebuild of every relation over the store (``_relations.refresh``,
   what ``Store.refresh`` does on a store without relations), relation by relation;
2. **storage**: the checkpointed file with raw rows only and with the relations, per million
   requests;
3. **steady state**: ``--steps`` times, the next 1 % of requests appended with ``Store.append``
   and ``Store(..., incremental=True).refresh()`` timed, with the slice's plan (t0, the region it
   reads, whether a partition became final);
4. **one slice refresh timed step by step** through ``audit._incremental.refresh``'s hooks: each
   relation's ``create temp`` over the region, each stored table's delete + insert, the rest by
   difference; every relation over an empty region (the floor); and how many of the region's
   requests the slice owns (the rest are context, computed and dropped); then the per-run rows
   of the runs it touched (``refresh_runs``) and the close, each in its own transaction;
5. on the smaller store also 10 % appended at once, and the ratios of refresh time to new rows
   and to store size.

    python3 benchmarks/incremental_refresh.py --requests 100000            # a few minutes
    python3 benchmarks/incremental_refresh.py --keep stores/incr             # 1M and 100k
    python3 benchmarks/incremental_refresh.py --keep stores/incr --reuse     # rebuild from the kept raw

``--keep DIR`` keeps the generated run and each size's raw-only store (``raw_<n>.duckdb``);
``--reuse`` starts from them instead of generating and tiling again. Each measurement works on a
copy, so a kept raw store stays as built.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from analysis_scaling import generate  # noqa: E402

from audit import _closed, _incremental, _relations, _span_keys  # noqa: E402
from audit._store import DEFAULT_PARTITIONING, Store, _add_missing_raw_columns, _record_refresh, _tune  # noqa: E402

_ID_COLUMNS = ("a_request_id", "a_gen_ai_request_id", "a_router_request_id", "a_rid")
_RUN_COLUMNS = ("a_run_id", "r_run_id")
_SPAN_NS = ("start_ns", "end_ns", "received_ns", "a_decision_time_ns")
_EVENT_NS = ("time_ns", "c_telemetry_ts_ns")
GIB = 2**30


class Traffic:
    """Continuous traffic made of copies of one run: request ``i`` is request ``i % B`` (in start
    order) of copy ``i // B``, shifted by ``i // B`` run lengths plus gaps."""

    def __init__(self, base: Path, gap_s: float) -> None:
        self.con = duckdb.connect()
        self.con.execute(f"attach '{base}' as base (read_only)")
        self.con.execute("create table spans as select * from base.raw_spans")
        self.con.execute("create table events as select * from base.raw_span_events")
        self.con.execute("detach base")
        # one trace per request in the testbed's runs: rank traces by their first start
        self.con.execute("create table ranks as select trace_id, row_number() over "
                         "(order by min(start_ns), trace_id) - 1 as rnk from spans group by trace_id")
        self.per_copy = int(self.con.execute("select count(*) from ranks").fetchall()[0][0])
        lo, hi = self.con.execute("select min(start_ns), max(end_ns) from spans").fetchall()[0]
        self.shift = int(hi - lo + gap_s * 1e9)

    def _copy_sql(self, k: int, lo: int, hi: int, events: bool) -> str:
        """Ranks [lo, hi) of copy k."""
        tag = f"-t{k}"
        trace = f"md5(trace_id || '{tag}')" if k else "trace_id"
        pick = f"semi join (select trace_id from ranks where rnk >= {lo} and rnk < {hi}) using (trace_id)"
        if events:
            repl = [f"{trace} as trace_id"] + [f"{c} + {k * self.shift} as {c}" for c in _EVENT_NS]
            return f"select * replace ({', '.join(repl)}) from events {pick}"
        if not k:
            return f"select * from spans {pick}"
        repl = [f"{trace} as trace_id"] + [f"{c} + {k * self.shift} as {c}" for c in _SPAN_NS]
        repl += [f"{c} || '{tag}' as {c}" for c in _RUN_COLUMNS]
        # request ids are '<run_id>:<n>': keep the run prefix consistent with the run columns
        repl += [f"replace({c}, coalesce(r_run_id, a_run_id) || ':', "
                 f"coalesce(r_run_id, a_run_id) || '{tag}:') as {c}" for c in _ID_COLUMNS]
        return f"select * replace ({', '.join(repl)}) from spans {pick}"

    def pieces(self, first: int, last: int) -> list[tuple[int, int, int]]:
        """(copy, rank from, rank to) covering requests [first, last)."""
        out = []
        i = first
        while i < last:
            k, r = divmod(i, self.per_copy)
            upto = min(self.per_copy, r + (last - i))
            out.append((k, r, upto))
            i += upto - r
        return out

    def arrow(self, first: int, last: int) -> tuple[pa.Table, pa.Table]:
        """Spans and events of requests [first, last), as Arrow tables for ``Store.append``."""
        spans, events = [], []
        for k, lo, hi in self.pieces(first, last):
            spans.append(self.con.sql(self._copy_sql(k, lo, hi, False)).to_arrow_table())
            events.append(self.con.sql(self._copy_sql(k, lo, hi, True)).to_arrow_table())
        return pa.concat_tables(spans), pa.concat_tables(events)

    def write_raw(self, path: Path, n: int, partition_s: float | None = None) -> float:
        """A store at ``path`` holding requests [0, n), raw tables only (relations not built),
        with ``partition_s`` wide partitions (None: a new store's default)."""
        t = time.perf_counter()
        for p in (path, Path(f"{path}.wal")):
            p.unlink(missing_ok=True)
        # the raw DDL, routeaudit_meta with the partitioning, the marks table, empty relations
        empty = Store(path, partitioning=None if partition_s is None else {"partition_s": partition_s})
        empty.close()
        self.con.execute(f"attach '{path}' as dst")
        try:
            for j, (k, lo, hi) in enumerate(self.pieces(0, n)):
                self.con.execute(f"insert into dst.raw_spans by name {self._copy_sql(k, lo, hi, False)}")
                self.con.execute(f"insert into dst.raw_span_events by name {self._copy_sql(k, lo, hi, True)}")
                print(f"  copy {j + 1}", end="\r", file=sys.stderr, flush=True)
            # the spans' keys, as Store.append stores them with the spans
            _span_keys.fill(self.con, "dst")
            # the relations (built empty) no longer hold what the store does
            self.con.execute("delete from dst.routeaudit_meta where key = 'relations_spans'")
            self.con.execute("delete from dst.routeaudit_dirty")
            self.con.execute("checkpoint dst")
        finally:
            self.con.execute("detach dst")
        return time.perf_counter() - t


def file_bytes(path: Path) -> int:
    wal = Path(f"{path}.wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def closed_tables(path: Path) -> dict[str, int]:
    """Bytes of Parquet per table in the store's folder of closed partitions."""
    root = _closed.folder(path)
    if not root.exists():
        return {}
    return {d.name: sum(f.stat().st_size for f in d.rglob("*.parquet"))
            for d in root.iterdir() if d.is_dir()}


def closed_bytes(path: Path) -> int:
    return sum(closed_tables(path).values())


def backfill(path: Path) -> tuple[float, list[tuple[str, float]]]:
    """A full rebuild (``_relations.refresh`` as ``Store.refresh`` runs it), relation by relation."""
    con = duckdb.connect(os.fspath(path))
    _tune(con)
    _add_missing_raw_columns(con)  # a kept raw store may predate a raw column
    out: list[tuple[str, float]] = []
    t = time.perf_counter()
    _relations.refresh(con, on_built=lambda rel, kind, s: out.append((rel.name, s)),
                       before_commit=_record_refresh)
    total = time.perf_counter() - t
    con.execute("checkpoint")
    con.close()
    return total, out


@dataclass
class Storage:
    """Blocks in use in a checkpointed store (a file keeps freed blocks for reuse, so its size
    overstates what it holds), and per table the blocks its column segments occupy."""

    used_bytes: int
    file_bytes: int
    tables: dict[str, int]


RAW_TABLES = ("raw_spans", "raw_span_events", "raw_snapshots")


def storage(path: Path) -> Storage:
    con = duckdb.connect(os.fspath(path), read_only=True)
    try:
        block, used, total = con.execute(
            "select block_size, used_blocks, total_blocks from pragma_database_size()").fetchall()[0]
        tables: dict[str, int] = {}
        for (name,) in con.execute("select table_name from duckdb_tables() "
                                   "where database_name = current_database()").fetchall():
            blocks = con.execute(f"select count(distinct block_id) from pragma_storage_info('{name}') "
                                 "where block_id >= 0").fetchall()[0][0]
            tables[name] = int(blocks or 0) * int(block)
        return Storage(int(used) * int(block), int(total) * int(block), tables)
    finally:
        con.close()


def print_storage(st: Storage, n: int, top: int) -> None:
    raw = sum(b for t, b in st.tables.items() if t in RAW_TABLES)
    derived = sum(b for t, b in st.tables.items() if t not in RAW_TABLES)
    per_m = 1e6 / n / GIB
    print(f"  storage in use: {st.used_bytes / GIB:.2f} GiB of a {st.file_bytes / GIB:.2f} GiB file; per million "
          f"requests {st.used_bytes * per_m:.2f} GiB: raw tables {raw * per_m:.2f}, derived tables "
          f"{derived * per_m:.2f}, the rest (metadata) {(st.used_bytes - raw - derived) * per_m:.2f}")
    biggest = sorted(((b, t) for t, b in st.tables.items() if t not in RAW_TABLES), reverse=True)[:top]
    print("    largest derived: " + ", ".join(f"{t} {b * per_m:.2f}" for b, t in biggest))


@dataclass
class Step:
    new_requests: int
    append_s: float
    refresh_s: float
    kind: str
    plan: _incremental.Plan | None
    newest_ns: int


@dataclass
class Breakdown:
    """One slice refresh timed step by step."""

    plan: _incremental.Plan | None = None
    stages: list[tuple[str, float]] = field(default_factory=list)
    stages_after: list[tuple[str, float]] = field(default_factory=list)
    relations: list[tuple[str, float]] = field(default_factory=list)
    writes: list[tuple[str, float]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    total_s: float = 0.0


def timed_slice_refresh(con: duckdb.DuckDBPyConnection, store_path: Path) -> Breakdown:
    """``audit._incremental.refresh`` timed through its hooks: each relation built over the
    region, each stored table rewritten; the rest (plan, key sets, commit) by difference. In the
    transaction, before its record is written, it counts how much of the region the slice owns
    (not counted in the total)."""
    bd = Breakdown()
    marks: dict[str, float] = {}

    def on_plan(pl: _incremental.Plan) -> None:
        bd.plan = pl
        marks["planned"] = time.perf_counter()

    def on_built(name: str, seconds: float) -> None:
        verb, _, what = name.partition(" ")
        if verb != "build" and not bd.counts:
            # the slice's relations and key sets exist until the per-run tables are rewritten
            c0 = time.perf_counter()
            for key, sql in (("region_spans", "select count(*) from temp.main.raw_spans"),
                             ("region_requests", "select count(*) from temp.main.requests"),
                             ("owned_requests", "select count(*) from _owned_new_requests"),
                             ("stored_owned_requests", "select count(*) from _owned_old_requests")):
                bd.counts[key] = int(con.execute(sql).fetchall()[0][0])
            marks["counting"] = time.perf_counter() - c0
        (bd.relations if verb == "build" else bd.writes).append((what, seconds))

    def before_commit(c: duckdb.DuckDBPyConnection, spans: int) -> None:
        _record_refresh(c, spans)
        marks["committing"] = time.perf_counter()

    started = time.perf_counter()
    _incremental.refresh(con, before_commit=before_commit, on_plan=on_plan, on_built=on_built,
                         store_path=store_path)
    ended = time.perf_counter()
    if bd.plan is None:
        return bd
    bd.total_s = ended - started - marks["counting"]
    build = sum(s for _, s in bd.relations)
    write = sum(s for _, s in bd.writes)
    commit = ended - marks["committing"]
    plan = marks["planned"] - started
    bd.stages = [("plan", plan), ("relations over the region (create temp)", build),
                 ("restricted raw views, owned key sets", bd.total_s - plan - build - write - commit),
                 ("delete + insert the owned rows", write), ("commit", commit)]
    return bd


def profiled_refresh(store: Store) -> Breakdown:
    """Refresh the rows appended to ``store`` in the order ``Store.refresh`` does, each part
    timed: the slice (:func:`timed_slice_refresh`), then the per-run rows of the runs it touched
    and the move of the partitions the horizon has passed to Parquet (``stages_after``)."""
    cur = store._con.cursor()
    try:
        bd = timed_slice_refresh(cur, store.path)
        t = time.perf_counter()
        runs = _incremental.refresh_runs(cur, store.path)
        bd.stages_after = [(f"recompute the per-run rows ({runs} runs)", time.perf_counter() - t)]
        t = time.perf_counter()
        moved = _closed.close(cur, store.path, _incremental.horizon(cur)[0])
        bd.stages_after.append((f"close the partitions passed ({len(moved.partitions)})",
                                time.perf_counter() - t))
    finally:
        cur.close()
    store._dirty = False  # refreshed above, not through the store
    return bd


def print_breakdown(bd: Breakdown, top: int) -> None:
    """The stages of a :func:`profiled_refresh`, its slowest relations and writes."""
    for name, s in bd.stages:
        print(f"    {name:<44} {s:7.2f} s  {s / bd.total_s:6.1%}")
    for name, s in bd.stages_after:
        print(f"    then {name:<39} {s:7.2f} s")
    print("    slowest relations (create temp over the region):")
    for name, s in sorted(bd.relations, key=lambda r: -r[1])[:top]:
        print(f"      {name:<48} {s:7.3f} s")
    print("    slowest writes (delete + insert into the stored table):")
    for name, s in sorted(bd.writes, key=lambda r: -r[1])[:top]:
        print(f"      {name:<48} {s:7.3f} s")


def empty_region_s(con: duckdb.DuckDBPyConnection) -> float:
    """Every relation created over raw tables restricted to nothing, rolled back: what a slice
    refresh costs whatever its rows (planning and running each of the statements)."""
    db = con.execute("select current_database()").fetchall()[0][0]
    rels = _relations.load_relations()
    as_views = _relations.views(rels)
    con.execute("begin transaction")
    try:
        t = time.perf_counter()
        for raw in ("raw_spans", "raw_span_events", "raw_snapshots"):
            con.execute(f'create or replace temp view {raw} as select * from "{db}".main.{raw} where false')
        for rel in rels:
            kind = "view" if rel.name in as_views else "table"
            con.execute(f"create or replace temp {kind} {rel.name} as\n{rel.sql.strip().rstrip(';')}")
        return time.perf_counter() - t
    finally:
        con.execute("rollback")
        _incremental._drop_temp(con)


def watch_plans() -> list[_incremental.Plan]:
    """Record every plan ``audit._incremental.refresh`` makes (it calls the module's ``plan``)."""
    seen: list[_incremental.Plan] = []
    original = _incremental.plan

    def recording(con: duckdb.DuckDBPyConnection, parts: _incremental.Partitioning,
                  skew_ns: int = _incremental.SKEW_NS) -> Any:
        pl = original(con, parts, skew_ns)
        if pl is not None:
            seen.append(pl)
        return pl

    _incremental.plan = recording
    return seen


PLANS = watch_plans()


def newest_ns(store: Store) -> int:
    return int(store._con.execute("select max(start_ns) from raw_spans").fetchall()[0][0])


def step(store: Store, traffic: Traffic, first: int, last: int) -> Step:
    spans, events = traffic.arrow(first, last)
    t = time.perf_counter()
    store.append(spans=spans, events=events)
    append_s = time.perf_counter() - t
    before = len(PLANS)
    refresh_s = store.refresh()
    pl = PLANS[-1] if len(PLANS) > before else None
    return Step(last - first, append_s, refresh_s, store.last_refresh_kind, pl, newest_ns(store))


def plan_text(pl: _incremental.Plan | None, newest: int, parts: _incremental.Partitioning) -> str:
    if pl is None:
        return "no plan"
    fin = "" if pl.finalising is None else (
        f", finalising the partition starting {(newest - pl.finalising * parts.partition_ns) / 1e9:,.0f} s "
        "before the newest span")
    return (f"t0 = newest − {(newest - pl.t0_ns) / 1e9:,.0f} s, recomputed from newest − "
            f"{(newest - pl.recompute_from_ns) / 1e9:,.0f} s (region "
            f"{(newest - pl.recompute_from_ns) / 1e9:,.0f} s, owned {(newest - pl.t0_ns) / 1e9:,.0f} s; "
            f"windows reach newest − {(newest - pl.read_from_ns) / 1e9:,.0f} s), "
            f"{pl.dirty_rows:,} marks{fin}")


def measure(raw: Path, work: Path, n: int, traffic: Traffic, steps: int, big_step: bool,
            top: int) -> dict[str, Any]:
    res: dict[str, Any] = {"n": n}
    for p in (work, Path(f"{work}.wal")):
        p.unlink(missing_ok=True)
    shutil.rmtree(_closed.folder(work), ignore_errors=True)
    shutil.copyfile(raw, work)
    res["raw_bytes"] = file_bytes(work)
    print(f"\n[{n:,} requests] raw store {res['raw_bytes'] / 2**20:,.0f} MiB "
          f"({res['raw_bytes'] / n * 1e6 / GIB:.2f} GiB per million requests)", flush=True)
    res["backfill_s"], rels = backfill(work)
    res["total_bytes"] = file_bytes(work)
    derived = res["total_bytes"] - res["raw_bytes"]
    print(f"  backfill (full rebuild, every relation): {res['backfill_s']:.1f} s; load {os.getloadavg()[0]:.1f}")
    for name, s in sorted(rels, key=lambda r: -r[1])[:top]:
        print(f"    {name:<40} {s:7.2f} s  {s / res['backfill_s']:6.1%}")
    print(f"  file after checkpoint: {res['total_bytes'] / GIB:.2f} GiB (raw-only file {res['raw_bytes'] / GIB:.2f}"
          f" + {derived / GIB:.2f}); per million requests {res['total_bytes'] / n * 1e6 / GIB:.2f} GiB")
    res["storage"] = storage(work)
    print_storage(res["storage"], n, top)
    sys.stdout.flush()

    store = Store(work, incremental=True)
    try:
        parts = _incremental.Partitioning.read(store._con)
        # once after a backfill: every partition the final horizon has passed leaves DuckDB
        t = time.perf_counter()
        store.refresh()
        res["close_s"] = time.perf_counter() - t
        failed = f"; failed: {store.last_close_error}" if store.last_close_error else ""
        print(f"  closing the partitions the horizon has passed (once, after a backfill): "
              f"{res['close_s']:.1f} s, up to partition {_closed.closed_until(store._con)}; "
              f"{closed_bytes(work) / GIB:.2f} GiB of Parquet{failed}", flush=True)
        one = max(1, n // 100)
        at = n
        res["steps"] = []
        for _ in range(steps):
            st = step(store, traffic, at, at + one)
            at += one
            res["steps"].append(st)
            print(f"  +1 % ({st.new_requests:,} requests): append {st.append_s:.2f} s, "
                  f"refresh {st.refresh_s:.2f} s [{st.kind}]; load {os.getloadavg()[0]:.1f}\n"
                  f"      {plan_text(st.plan, st.newest_ns, parts)}", flush=True)
        # one more 1 %, refreshed by the timed copy of the loop
        spans, events = traffic.arrow(at, at + one)
        at += one
        store.append(spans=spans, events=events)
        bd = profiled_refresh(store)
        cur = store._con.cursor()
        try:
            res["empty_region_s"] = empty_region_s(cur)
        finally:
            cur.close()
        res["breakdown"] = bd
        newest = newest_ns(store)
        print(f"  +1 % refreshed step by step: {bd.total_s:.2f} s\n      {plan_text(bd.plan, newest, parts)}")
        c = bd.counts
        if c:
            print(f"      region: {c['region_spans']:,} raw spans, {c['region_requests']:,} requests recomputed, "
                  f"{c['owned_requests']:,} owned (anchor ≥ t0; "
                  f"{c['owned_requests'] / max(1, c['region_requests']):.0%}), "
                  f"{one:,} new; {c['stored_owned_requests']:,} stored rows replaced")
        print(f"    (every relation over an empty region: {res['empty_region_s']:.2f} s, "
              f"{len(bd.relations)} statements)")
        print_breakdown(bd, top)
        if big_step:
            st = step(store, traffic, at, at + n // 10)
            at += n // 10
            res["big"] = st
            print(f"  +10 % ({st.new_requests:,} requests): append {st.append_s:.2f} s, "
                  f"refresh {st.refresh_s:.2f} s [{st.kind}]; load {os.getloadavg()[0]:.1f}\n"
                  f"      {plan_text(st.plan, st.newest_ns, parts)}", flush=True)
    finally:
        store.close()
    res["end_bytes"] = file_bytes(work)
    res["end_closed_bytes"] = closed_bytes(work)
    res["end_storage"] = storage(work)
    total = res["end_storage"].used_bytes + res["end_closed_bytes"]
    res["end_per_m"] = total / (at / 1e6)
    print(f"  after the incremental refreshes and a checkpoint: DuckDB file {res['end_bytes'] / GIB:.2f} GiB "
          f"({res['end_storage'].used_bytes / GIB:.2f} in use, the open partitions), Parquet of the closed "
          f"partitions {res['end_closed_bytes'] / GIB:.2f} GiB; per million requests "
          f"{total / (at / 1e6) / GIB:.2f} GiB in use")
    for table, b in sorted(closed_tables(work).items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {table:<40} {b / (at / 1e6) / GIB:6.3f} GiB per million (Parquet)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests in the large store")
    ap.add_argument("--compare", type=int, default=100_000,
                    help="a smaller store measured the same way, with a 10 %% step (0: none)")
    ap.add_argument("--base", type=int, default=10_000, help="requests in the generated run")
    ap.add_argument("--gap-s", type=float, default=5.0, help="seconds between copies of the run")
    ap.add_argument("--steps", type=int, default=3, help="1 %% steps timed")
    ap.add_argument("--keep", default=None, help="folder for the run and the raw stores (default: temp)")
    ap.add_argument("--reuse", action="store_true", help="reuse the run and raw stores in --keep")
    ap.add_argument("--top", type=int, default=10, help="relations listed")
    ap.add_argument("--partition-s", type=float, default=None,
                    help="the stores' partition width (default: a new store's, 60 s; the window "
                         "holds 600 s of traffic either way)")
    args = ap.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ra-incremental-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; "
          f"DuckDB {duckdb.__version__}; load {os.getloadavg()}")
    base = folder / f"run_{args.base}.duckdb"
    if not (args.reuse and base.exists()):
        for p in (base, Path(f"{base}.wal")):
            p.unlink(missing_ok=True)
        g = generate(base, args.base, 4096)
        print(f"generated a {args.base:,}-request run ({g['spans']:,} spans) in {g['generate_s']:.1f} s")
    traffic = Traffic(base, args.gap_s)
    print(f"continuous traffic: copies of {traffic.per_copy:,} requests, {traffic.shift / 1e9:,.0f} s apart; "
          f"partitions of {args.partition_s or DEFAULT_PARTITIONING['partition_s']:g} s")
    sizes = sorted({args.requests} | ({args.compare} if args.compare else set()))
    results = []
    for n in sizes:
        raw = folder / f"raw_{n}.duckdb"
        if not (args.reuse and raw.exists()):
            s = traffic.write_raw(raw, n, args.partition_s)
            print(f"[{n:,} requests] raw store written in {s:.1f} s", flush=True)
        results.append(measure(raw, folder / f"work_{n}.duckdb", n, traffic, args.steps,
                               big_step=(n == min(sizes)), top=args.top))
    print("\nsummary (refresh s after appending; median of the 1 % steps)")
    print("  requests | backfill s | 1 % new: refresh s | s per 1k new | 10 % new: refresh s | GiB per 1M "
          "(all in DuckDB; with closed partitions in Parquet)")
    med: dict[int, float] = {}
    for r in results:
        ts = sorted(s.refresh_s for s in r["steps"])
        med[r["n"]] = ts[len(ts) // 2]
        big = r.get("big")
        print(f"  {r['n']:>9,} | {r['backfill_s']:9.1f} | {med[r['n']]:8.2f} ({', '.join(f'{t:.2f}' for t in ts)}) | "
              f"{med[r['n']] / (r['n'] / 100) * 1000:7.3f} | "
              f"{'' if big is None else f'{big.refresh_s:8.2f}'} | {r['total_bytes'] / r['n'] * 1e6 / GIB:.2f}; "
              f"{r['end_per_m'] / GIB:.2f}")
    small = results[0]
    if small.get("big") is not None:
        print(f"  at {small['n']:,}: 10 % / 1 % refresh = {small['big'].refresh_s / med[small['n']]:.2f} "
              "(new rows ×10)")
    if len(results) > 1:
        a, b = results[0], results[-1]
        print(f"  1 % at {b['n']:,} / 1 % at {a['n']:,} = {med[b['n']] / med[a['n']]:.2f} "
              f"(new rows ×{b['n'] // a['n']}, history ×{b['n'] // a['n']})")
        if a.get("big") is not None:
            print(f"  1 % at {b['n']:,} / 10 % at {a['n']:,} (same new rows) = "
                  f"{med[b['n']] / a['big'].refresh_s:.2f} (history ×{b['n'] // a['n']})")
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
