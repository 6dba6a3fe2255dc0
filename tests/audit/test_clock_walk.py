"""The clock walk (int_clock_offsets): offsets propagate from the reference domain breadth-first,
any number of hops, each domain through its neighbour with the most span pairs (docs/clock.md).

The unit tests give the relation its two inputs as rows and read its output; the last one goes
through a store, spans nested across seven hosts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import duckdb
import pytest
from relation_rows import MS, T0, RawRows, query

from audit._relations import load_relations
from audit._store import Store
from semconv import COMPONENT, HOST_NAME, REQUEST_ID, SPAN_CLIENT

S = 1_000_000_000
Pair = tuple[str, str, int, int, int]
"""domain_a, domain_b, pair_count, lower_ns, upper_ns of d = offset(a) - offset(b)."""


def _offsets(pairs: list[Pair], reference: str = "d0", others: tuple[str, ...] = ()
             ) -> dict[str, dict[str, Any]]:
    """int_clock_offsets over these pairs, all in partition 0; ``reference`` holds the only
    client span."""
    sqls = {r.name: r.sql.strip().rstrip(";") for r in load_relations()}
    con = duckdb.connect()
    con.execute("create table routeaudit_meta (key varchar primary key, value varchar)")
    con.execute(f"create view stg_partitioning as {sqls['stg_partitioning']}")
    con.execute("create table stg_spans (clock_domain varchar, span_role varchar, start_ns bigint)")
    domains = {reference, *others} | {d for a, b, *_ in pairs for d in (a, b)}
    con.executemany("insert into stg_spans values (?, ?, 0)",
                    [(d, "client" if d == reference else "replica") for d in sorted(domains)])
    con.execute(f"create view int_clock_domain_spans as {sqls['int_clock_domain_spans']}")
    con.execute("create table int_clock_bounds_per_domain_pair (part bigint, domain_a varchar, "
                "domain_b varchar, pair_count bigint, lower_ns bigint, upper_ns bigint, "
                "is_consistent boolean, offset_a_minus_b_ns bigint, median_midpoint_ns bigint)")
    con.executemany("insert into int_clock_bounds_per_domain_pair values (0, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(a, b, n, lo, hi, lo <= hi, (lo + hi) // 2, (lo + hi) // 2)
                     for a, b, n, lo, hi in pairs])
    rel = con.sql(sqls["int_clock_offsets"])
    rows = [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]
    con.close()
    assert {r["part"] for r in rows} == {0}
    return {r["clock_domain"]: r for r in rows}


def _chain(n: int) -> list[Pair]:
    """d0 - d1 - ... - d<n>, each clock 1 s ahead of the one before (± 10 ms bounds)."""
    return [(f"d{k}", f"d{k + 1}", 1, -S - 10 * MS, -S + 10 * MS) for k in range(n)]


def test_a_chain_longer_than_four_hops_is_walked_to_its_end() -> None:
    got = _offsets(_chain(9))
    assert len(got) == 10
    for k in range(10):
        row = got[f"d{k}"]
        assert row["hops"] == k
        assert row["offset_ns"] == k * S
        assert (row["offset_lower_ns"], row["offset_upper_ns"]) == (k * (S - 10 * MS), k * (S + 10 * MS))
        assert row["via_domain"] == (f"d{k - 1}" if k else None)
        assert row["clock_status"] == ("reference" if k == 0 else "bounded")


def test_each_domain_is_reached_by_the_fewest_hops_then_the_most_pairs() -> None:
    # d3 is one hop from d1 and from d2 (d1's edge has more pairs: it wins), and three hops
    # through the heavy chain d0 - d4 - d5 (never taken: fewer hops first)
    got = _offsets([
        ("d0", "d1", 1, -S, -S), ("d0", "d2", 1, -2 * S, -2 * S),
        ("d1", "d3", 5, -3 * S, -3 * S), ("d2", "d3", 2, -7 * S, -7 * S),
        ("d0", "d4", 50, 0, 0), ("d4", "d5", 50, 0, 0), ("d3", "d5", 50, 0, 0),
    ])
    assert (got["d3"]["hops"], got["d3"]["via_domain"], got["d3"]["offset_ns"]) == (2, "d1", 4 * S)
    # a tie in pairs goes to the neighbour whose name sorts first
    tie = _offsets([("d0", "d1", 1, 0, 0), ("d0", "d2", 1, 0, 0),
                    ("d1", "d3", 3, -S, -S), ("d2", "d3", 3, -2 * S, -2 * S)])
    assert (tie["d3"]["via_domain"], tie["d3"]["offset_ns"]) == ("d1", S)


def test_an_inconsistent_edge_marks_everything_beyond_it_and_both_its_ends() -> None:
    pairs = _chain(6)
    pairs[2] = ("d2", "d3", 1, -S + 10 * MS, -S - 10 * MS)  # empty bounds: a jump
    got = _offsets(pairs)
    status = {d: got[d]["clock_status"] for d in got}
    assert status == {"d0": "reference", "d1": "bounded", "d2": "inconsistent", "d3": "inconsistent",
                      "d4": "inconsistent", "d5": "inconsistent", "d6": "inconsistent"}


def test_cycles_end_and_unconnected_domains_are_unbounded() -> None:
    got = _offsets([("d0", "d1", 1, -S, -S), ("d1", "d2", 1, -S, -S), ("d0", "d2", 1, -2 * S, -2 * S),
                    ("d7", "d8", 1, 0, 0)], others=("d9",))
    assert {d: got[d]["hops"] for d in ("d0", "d1", "d2")} == {"d0": 0, "d1": 1, "d2": 1}
    for d in ("d7", "d8", "d9"):
        assert (got[d]["clock_status"], got[d]["offset_ns"], got[d]["hops"]) == ("unbounded", 0, None)


def test_spans_nested_across_seven_hosts_are_put_on_the_reference_clock(
        make_store: Callable[..., Store]) -> None:
    """A client span on host-0 and, nested in it, one span per host up to host-6, each host's
    clock ``k`` seconds ahead: the store finds every offset, the last one six hops away."""
    rows = RawRows()
    for n in range(3):  # three requests, so each pair of hosts has three pairs of spans
        base = T0 + n * 2 * S
        parent = None
        for k in range(7):
            span_id = f"{n}{k:x}"
            start, end = base + k * 10 * MS, base + S - k * 10 * MS  # true time, nested
            attrs: dict[str, Any] = {COMPONENT: "client", REQUEST_ID: f"chain-{n}"} if k == 0 else {}
            rows.span(f"c{n}", span_id, parent, SPAN_CLIENT if k == 0 else f"hop-{k}",
                      kind="client" if k == 0 else "server",
                      start_ns=start + k * S, end_ns=end + k * S, attrs=attrs,
                      resource={HOST_NAME: f"host-{k}"})
            parent = span_id
    got = query(make_store(rows), "select * from int_clock_offsets order by clock_domain")
    assert got["clock_domain"].to_list() == [f"host-{k}" for k in range(7)]
    assert got["hops"].to_list() == list(range(7))
    assert got["offset_ns"].to_list() == [k * S for k in range(7)]
    assert got["clock_status"].to_list() == ["reference"] + ["bounded"] * 6


@pytest.mark.parametrize("hops", [1, 4, 5, 30])
def test_the_walk_has_no_hop_limit(hops: int) -> None:
    got = _offsets(_chain(hops))
    assert got[f"d{hops}"]["hops"] == hops and got[f"d{hops}"]["clock_status"] == "bounded"


def test_offsets_are_rounded_to_100_us_within_their_bounds() -> None:
    """A new pair that tightens the bounds by a few µs rarely moves a rounded offset; bounds
    narrower than the rounding keep the offset inside them."""
    got = _offsets([("d0", "d1", 1, -1_234_567 - 10 * MS, -1_234_567 + 10 * MS),
                    ("d0", "d2", 1, -1_234_567 - 20_000, -1_234_567 + 20_000)])
    assert got["d1"]["offset_ns"] == 1_200_000
    assert got["d2"]["offset_ns"] == 1_214_567  # the nearest point of [1.214567, 1.254567] ms
    assert (got["d2"]["offset_lower_ns"], got["d2"]["offset_upper_ns"]) == (1_214_567, 1_254_567)
