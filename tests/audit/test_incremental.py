"""Equivalence: a store refreshed by slices after each of many random batches holds the same
relations as a one-shot build over the same rows.

The batches come from the committed sample data (a testbed replay: several routers' policies,
evictions, preemptions, stale telemetry), delivered roughly in time order with the disorder a
fleet's exporters produce: spans of one request in different batches (late parents, late
replica spans), a batch resent (duplicates), scrapes between decisions. Partitions are 60 s
wide, so the store spans many partitions, windows and finalisations.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tiled_sample import batches, new_store, relation_rows, tiled_sample

from audit import _incremental, _relations
from audit._store import Store

BATCHES = 6

SLICE_STEPS: set[str] = set()
"""What the slices of the module's incremental store did (``build <relation>``, ``replace
<table>``)."""

COMPARED = [r for r in _relations.public_relations() if r not in {"raw_span_attributes", "slo_targets"}]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store, list[str]]]:
    # the default-SLO tables of the public views, as a large store has them, so that their
    # rewriting is compared too (below CACHE_MIN_SPANS the views compute live)
    patch = pytest.MonkeyPatch()
    patch.setattr(_relations, "CACHE_MIN_SPANS", 0)
    sliced = _incremental.refresh

    def recording(con, **options):  # type: ignore[no-untyped-def]
        return sliced(con, on_built=lambda step, _: SLICE_STEPS.add(step), **options)

    patch.setattr(_incremental, "refresh", recording)
    d = tmp_path_factory.mktemp("incremental")
    raw = tiled_sample()
    one = new_store(d / "one.duckdb", incremental=False)
    one.append(spans=raw["raw_spans"], events=raw["raw_span_events"],
               snapshots=raw["raw_snapshots"])
    one.refresh()
    inc = new_store(d / "inc.duckdb", incremental=True)
    kinds: list[str] = []
    for batch in batches(raw, seed=7, batches=BATCHES):
        inc.append(spans=batch["spans"], events=batch["events"], snapshots=batch["snapshots"])
        inc.refresh()
        kinds.append(inc.last_refresh_kind)
    try:
        cached = inc._con.execute("select count(*) from duckdb_tables() where table_name like "
                                  "'%__cached'").fetchall()[0][0]
        assert cached >= 3, "the default-SLO tables exist"
        yield one, inc, kinds
    finally:
        one.close()
        inc.close()
        patch.undo()


def test_batches_after_the_first_refresh_by_slices(stores: tuple[Store, Store, list[str]]) -> None:
    _, _, kinds = stores
    # a new store is built (empty) when opened; from then on every refresh is a slice
    assert set(kinds) <= {"slice", "none"} and kinds.count("slice") >= BATCHES - 2, kinds


def test_a_slice_builds_what_its_stored_tables_read(stores: tuple[Store, Store, list[str]]) -> None:
    """Every stored table is rebuilt (a default-SLO table from its view's rows), and a view no
    stored table reads is not created: its rows are computed when it is queried, and binding a
    mart view binds every view under it."""
    built = {step.removeprefix("build ") for step in SLICE_STEPS if step.startswith("build ")}
    assert {"int_attr_candidates_state", "requests", "attributions", "slow_requests"} <= built
    # per-run relations (recomputed after the slice for the runs it touched) and the raw view
    assert not built & {"calibration", "slo_summary", "raw_span_attributes"}, built


@pytest.mark.parametrize("relation", COMPARED)
def test_slices_give_the_one_shot_relations(stores: tuple[Store, Store, list[str]], relation: str) -> None:
    one, inc, _ = stores
    a, b = relation_rows(one, relation), relation_rows(inc, relation)
    only_one = sorted(set(a) - set(b))[:3]
    only_inc = sorted(set(b) - set(a))[:3]
    assert len(a) == len(b) and not only_one and not only_inc, (
        f"{relation}: one-shot {len(a)} rows, incremental {len(b)}\n"
        f"only one-shot: {only_one}\nonly incremental: {only_inc}")
