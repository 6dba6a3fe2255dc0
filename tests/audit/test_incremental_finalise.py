"""The watermark marks verdicts final in a store refreshed by slices, as the rule says.

Spans arrive in time order, a few minutes of traffic per batch, so partitions pass the watermark
(their end + ``max_request_s``, behind the newest span by ``lateness_s``) long after the last
slice that recomputed them: their rows must be marked ``verdict_final`` all the same, and the
rest stay provisional. The rule is recomputed here from the stored rows, not from the
relations' SQL.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from tiled_sample import SETTINGS, new_store, tiled_sample

from audit import _incremental

PART_NS = int(float(SETTINGS["partition_s"]) * 1e9)
LONGEST_NS = int(float(SETTINGS["max_request_s"]) * 1e9)
LATE_NS = int(float(SETTINGS["lateness_s"]) * 1e9)
BATCH_NS = 60 * 10**9


def _in_time_order(raw: dict[str, pa.Table]) -> list[dict[str, pa.Table]]:
    """Spans cut by their end (an exporter sends a span when it ends) into batches of
    :data:`BATCH_NS`, each with its events; scrapes by scrape time."""
    spans, events, snaps = raw["raw_spans"], raw["raw_span_events"], raw["raw_snapshots"]
    ends = spans.column("end_ns")
    lo = pc.min(ends).as_py()
    hi = pc.max(ends).as_py()
    out = []
    for t in range(lo, hi + 1, BATCH_NS):
        mask = pc.and_(pc.greater_equal(ends, t), pc.less(ends, t + BATCH_NS))
        part = spans.filter(mask)
        keys = pc.binary_join_element_wise(part.column("trace_id"), part.column("span_id"), ":")
        ev_keys = pc.binary_join_element_wise(events.column("trace_id"), events.column("span_id"), ":")
        scraped = snaps.column("scraped_ns")
        out.append({"spans": part, "events": events.filter(pc.is_in(ev_keys, value_set=keys)),
                    "snapshots": snaps.filter(pc.and_(pc.greater_equal(scraped, t if t > lo else 0),
                                                      pc.less(scraped, t + BATCH_NS)))})
    return out


def test_partitions_the_watermark_passes_are_marked_final(tmp_path: Path) -> None:
    raw = tiled_sample()
    store = new_store(tmp_path / "inc.duckdb", incremental=True)
    plans: list[_incremental.Plan] = []
    original = _incremental.plan

    def recording(con, parts, skew_ns=_incremental.SKEW_NS):  # type: ignore[no-untyped-def]
        pl = original(con, parts, skew_ns)
        if pl is not None:
            plans.append(pl)
        return pl

    _incremental.plan = recording
    try:
        finals: list[int] = []
        flagged_without_slice = 0
        seen_final: set[int] = set()
        ordered = _in_time_order(raw)
        for batch_no, batch in enumerate(ordered):
            store.append(spans=batch["spans"], events=batch["events"],
                         snapshots=batch["snapshots"])
            store.refresh()
            newest = store.query_arrow(
                "select max(corrected_start_ns) as n from int_spans_clock_corrected").column(0)[0].as_py()
            watermark = newest - LATE_NS
            rows = store.query_arrow("select request_key, part, verdict_final from requests").to_pylist()
            wrong = [r for r in rows
                     if r["verdict_final"] != ((r["part"] + 1) * PART_NS + LONGEST_NS <= watermark)]
            assert not wrong, (len(wrong), wrong[:3])
            # every relation carrying the flag agrees with requests (the two views, computed
            # whole from the view tree in a store this small, every third batch and the last)
            checked = ("int_attr_requests_judged",)
            if batch_no % 3 == 0 or batch_no == len(ordered) - 1:
                checked += ("attributions", "int_attr_candidates_assessed")
            for relation in checked:
                disagree = store.query_arrow(
                    f"select count(*) from {relation} as x join requests as r using (request_key) "
                    f"where x.verdict_final <> r.verdict_final").column(0)[0].as_py()
                assert disagree == 0, relation
            final_parts = {r["part"] for r in rows if r["verdict_final"]}
            newly = final_parts - seen_final
            seen_final |= final_parts
            finals.append(len(final_parts))
            if plans and newly and min(newly) < plans[-1].t0_ns // PART_NS:
                flagged_without_slice += 1
        assert finals[-1] >= 5 and finals == sorted(finals), finals
        # the case this test is for: partitions marked final by slices that started after them
        assert flagged_without_slice >= 3, flagged_without_slice
    finally:
        _incremental.plan = original
        store.close()
