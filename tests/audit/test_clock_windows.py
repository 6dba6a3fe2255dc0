"""Clock offsets per time partition (docs/clock.md, "Windows of partitions").

Partition p's offsets come from the bounds of partitions p - window_partitions .. p only: a clock
that drifts or jumps is followed partition by partition instead of making the whole store
inconsistent, and spans stored for a later partition never change an earlier partition's
offsets or corrected times.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from relation_rows import MS, T0, RawRows, one_request, query

import semconv
from audit._store import Store

PART_NS = 300 * 10**9
"""The partition width of these stores; T0 starts a partition."""

PARTITIONING = {"partition_s": PART_NS / 1e9, "window_partitions": 2}
"""Windows of two partitions before their own, which the partitions far apart below outreach."""


def _requests(rows: RawRows, part: int, router_skew_ms: int, *, first_n: int, count: int = 3) -> None:
    """``count`` requests 2 s apart at the start of partition ``part``, the router's clock
    ``router_skew_ms`` ahead of the client's (the replica's runs 0 ms ahead)."""
    for i in range(count):
        one_request(rows, n=first_n + i, base_ns=T0 + part * PART_NS + i * 2000 * MS,
                    router_skew_ns=router_skew_ms * MS)


def _offsets(store: Store, domain: str) -> dict[int, tuple[int, str]]:
    got = query(store, "select part, offset_ns, clock_status from int_clock_offsets "
                       "where clock_domain = ? order by part", [domain])
    first = T0 // PART_NS
    return {p - first: (o, s) for p, o, s in got.iter_rows()}


def test_a_drifting_clock_is_followed_partition_by_partition(make_store: Callable[..., Store]) -> None:
    """The router's clock runs 0, 400 and 800 ms ahead in partitions far apart: each partition
    gets its own offset, exactly, where one offset for the whole store has no consistent value."""
    rows = RawRows()
    for k, (part, skew_ms) in enumerate([(0, 0), (5, 400), (10, 800)]):
        _requests(rows, part, skew_ms, first_n=1 + 3 * k)
    store = make_store(rows, partitioning=PARTITIONING)
    # the store's pairs together admit no single offset
    lower, upper = query(store, "select max(lower_ns), min(upper_ns) from int_clock_bounds_per_domain_pair "
                                "where domain_a = 'client-host' and domain_b = 'router-host'").row(0)
    assert lower > upper
    # d(router - client) in [skew - 5 ms, skew + 5 ms] per partition: its midpoint is the skew
    assert _offsets(store, "router-host") == {0: (0, "bounded"), 5: (400 * MS, "bounded"),
                                              10: (800 * MS, "bounded")}
    assert _offsets(store, "replica-host") == {p: (-MS, "bounded") for p in (0, 5, 10)}
    assert query(store, "select count(*) filter (where clock_suspect) from requests").item() == 0
    # every forward span starts 7 ms after its client span on the reference clock
    gaps = query(store, """
        select f.corrected_start_ns - c.corrected_start_ns as gap_ns
        from int_spans_clock_corrected as f
        inner join int_spans_clock_corrected as c using (request_key)
        where f.span_name = ? and c.span_role = 'client'
    """, [semconv.SPAN_FORWARD])
    assert gaps["gap_ns"].to_list() == [7 * MS] * 9


def _store_with_meta(path: Path, **meta: int) -> Store:
    """A store whose routeaudit_meta holds these partitioning settings from the start."""
    con = duckdb.connect(str(path))
    con.execute("create table routeaudit_meta (key varchar primary key, value varchar)")
    con.executemany("insert into routeaudit_meta values (?, ?)",
                    [(k, str(v)) for k, v in {"partition_s": PART_NS / 1e9, **meta}.items()])
    con.close()
    return Store(path)


@pytest.mark.parametrize("window", [0, 1, 2])
def test_a_clock_jump_is_inconsistent_only_in_the_windows_that_span_it(tmp_path: Path, window: int) -> None:
    """The router's clock jumps 400 ms between partitions 0 and 1: partitions 1 .. window read
    bounds from both sides of the jump; from partition window + 1 on the new offset holds."""
    rows = RawRows()
    _requests(rows, 0, 0, first_n=1)
    for part in range(1, 5):
        _requests(rows, part, 400, first_n=1 + 3 * part)
    store = _store_with_meta(tmp_path / "audit.duckdb", window_partitions=window)
    try:
        spans, events = rows.tables()
        store.append(spans=spans, events=events)
        got = _offsets(store, "router-host")
        suspect = query(store, "select part, bool_and(clock_suspect) as all_suspect, "
                               "bool_or(clock_suspect) as any_suspect from requests "
                               "group by part order by part")
    finally:
        store.close()
    assert got[0] == (0, "bounded")
    for part in range(1, 5):
        if part <= window:
            assert got[part][1] == "inconsistent", part
        else:
            assert got[part] == (400 * MS, "bounded"), part
    first = T0 // PART_NS
    assert {p - first: (a, b) for p, a, b in suspect.iter_rows()} == {
        p: (1 <= p <= window, 1 <= p <= window) for p in range(5)}


def _corrected(store: Store, parts: int) -> list[tuple[Any, ...]]:
    return query(store, """
        select trace_id, span_id, clock_offset_ns, clock_status,
            corrected_start_ns, corrected_end_ns, corrected_decided_ns
        from int_spans_clock_corrected
        where start_ns < ?
        order by trace_id, span_id
    """, [T0 + parts * PART_NS]).rows()


def test_a_later_partition_changes_no_earlier_offset_or_corrected_time(
        make_store: Callable[..., Store]) -> None:
    """Partitions 0 and 1 are stored and built; then partition 2 arrives with the router's
    clock 3 s ahead and more client spans on another host than the store held before (over
    the whole store, both would move every offset: an empty intersection, another reference)."""
    early = RawRows()
    _requests(early, 0, 20, first_n=1)
    _requests(early, 1, 20, first_n=4)
    late = RawRows()
    _requests(late, 2, 3020, first_n=7)
    for i in range(10):  # lone client spans of another client host
        late.span(f"b{i}", f"b{i}", None, semconv.SPAN_CLIENT, kind="client",
                  start_ns=T0 + 2 * PART_NS + i * MS, end_ns=T0 + 2 * PART_NS + (i + 100) * MS,
                  attrs={semconv.COMPONENT: "client", semconv.REQUEST_ID: f"other-{i}"},
                  resource={semconv.HOST_NAME: "client-host-2"})
    store = make_store(early, partitioning=PARTITIONING)
    offsets_sql = "select * from int_clock_offsets where part < ? order by all"
    limit = [T0 // PART_NS + 2]
    before_offsets = query(store, offsets_sql, limit).rows()
    before_spans = _corrected(store, 2)
    assert [r[-1] for r in before_offsets].count("bounded") == 4  # router, replica in parts 0, 1
    spans, events = late.tables()
    store.append(spans=spans, events=events)
    assert query(store, "select count(*) from int_clock_offsets where part = ?",
                 [T0 // PART_NS + 2]).item() > 0
    assert query(store, offsets_sql, limit).rows() == before_offsets
    assert _corrected(store, 2) == before_spans
