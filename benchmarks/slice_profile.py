"""One slice of a store's newest traffic, step by step: what an always-on refresh spends its time on.

The raw rows of ``--db`` (a soak's kept store, say; its closed partitions included, read through
``audit.open``) go into a fresh store with the same partitioning, all but the traces that have a
span in the newest ``--hold`` seconds. That store is built whole and checkpointed; then the held
traces are appended and refreshed as ``Store.refresh`` does, each part timed
(``incremental_refresh.profiled_refresh``: the slice's plan, its relations, its writes, the
commit, then the per-run rows and closing partitions). ``--partition-s`` gives the copy another
partition width, which sets the region a slice recomputes.

    python3 benchmarks/always_on_soak.py --rate 200 --minutes 10 --senders 2 --partition-s 15 --keep soak200
    python3 benchmarks/slice_profile.py --db soak200/audit.duckdb --hold 5
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from incremental_refresh import plan_text, print_breakdown, profiled_refresh  # noqa: E402

import audit  # noqa: E402
from audit import _incremental  # noqa: E402
from audit._store import Store  # noqa: E402

SETTINGS = ("partition_s", "window_partitions", "lateness_s", "max_request_s")


def profile(db: Path, hold_s: float, top: int, partition_s: float | None = None) -> None:
    reader = audit.open(db)
    spans = reader.query_arrow("select * from raw_spans")
    events = reader.query_arrow("select * from raw_span_events")
    snapshots = reader.query_arrow("select * from raw_snapshots")
    settings = [(str(k), str(v)) for k, v in reader.query(
        "select key, value from routeaudit_meta where key in "
        f"({', '.join(repr(k) for k in SETTINGS)})").iter_rows()]
    if partition_s is not None:
        settings = [kv for kv in settings if kv[0] != "partition_s"] + [("partition_s", str(partition_s))]
    newest = int(pc.max(spans["start_ns"]).as_py())
    held = pc.unique(spans.filter(pc.greater_equal(spans["start_ns"],
                                                   newest - int(hold_s * 1e9)))["trace_id"])
    span_held = pc.is_in(spans["trace_id"], value_set=held)
    event_held = pc.is_in(events["trace_id"], value_set=held)
    print(f"{db}: {spans.num_rows:,} spans; holding back {len(held):,} traces "
          f"({pc.sum(span_held).as_py():,} spans) of the newest {hold_s:g} s; settings {dict(settings)}")

    folder = Path(tempfile.mkdtemp(prefix="slice_profile_"))
    store = Store(folder / "audit.duckdb", incremental=True)
    try:
        if settings:
            store._con.executemany("insert or replace into routeaudit_meta values (?, ?)",
                                   settings)
        store.append(spans=spans.filter(pc.invert(span_held)),
                     events=events.filter(pc.invert(event_held)), snapshots=snapshots)
        store._full_rebuild_due = True
        started = time.perf_counter()
        store.refresh()
        store._con.execute("checkpoint")
        print(f"built whole without them in {time.perf_counter() - started:.1f} s")

        store.append(spans=spans.filter(span_held), events=events.filter(event_held))
        bd = profiled_refresh(store)
        after = sum(seconds for _, seconds in bd.stages_after)
        print(f"slice: {bd.total_s:.2f} s, then {after:.2f} s; "
              f"{plan_text(bd.plan, newest, _incremental.Partitioning.read(store._con))}")
        print_breakdown(bd, top)
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, type=Path, help="the store to copy the raw rows of")
    ap.add_argument("--hold", type=float, default=5.0,
                    help="seconds of the newest traffic the slice brings")
    ap.add_argument("--top", type=int, default=15, help="steps listed")
    ap.add_argument("--partition-s", type=float, default=None,
                    help="the copy's partition width instead of the store's (how wide a region "
                         "a slice recomputes)")
    args = ap.parse_args()
    if not args.db.exists():
        ap.error(f"no store at {args.db}")
    if args.hold <= 0:
        ap.error("--hold must be > 0")
    if args.partition_s is not None and args.partition_s <= 0:
        ap.error("--partition-s must be > 0")
    profile(args.db, args.hold, args.top, args.partition_s)


if __name__ == "__main__":
    main()
