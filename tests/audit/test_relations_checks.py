"""Every check in audit/sql/checks/ returns no rows, over captures and over hand-built rows."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from relation_rows import RawRows, one_request, query

from audit._store import Store

CHECKS = sorted(
    p.name for p in resources.files("audit").joinpath("sql/checks").iterdir()
    if p.name.endswith(".sql")
)


def test_checks_exist() -> None:
    assert len(CHECKS) >= 10


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("which", ["captures", "hand_built"])
def test_check_returns_no_rows(
    check: str, which: str, request: pytest.FixtureRequest
) -> None:
    store: Store = request.getfixturevalue(
        "all_captures_store" if which == "captures" else "scenario_store"
    )
    sql = resources.files("audit").joinpath(f"sql/checks/{check}").read_text("utf-8")
    bad = query(store, sql)
    assert bad.height == 0, f"{check} on {which}:\n{bad}"


def test_a_check_catches_a_violation(tmp_path: Path) -> None:
    rows = RawRows()
    one_request(rows)
    rows.spans[-1]["a_usage_cache_read_tokens"] = 500  # more cached than prompt tokens
    store = Store(tmp_path / "bad.duckdb")
    try:
        spans, events = rows.tables()
        store.append(spans=spans, events=events)
        sql = resources.files("audit").joinpath(
            "sql/checks/requests_cached_le_input.sql").read_text("utf-8")
        assert query(store, sql).height == 1
    finally:
        store.close()
