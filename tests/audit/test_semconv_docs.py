"""docs/semconv.md mirrors the semconv package; docs/schema.md lists every mart column."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from relation_rows import query

import semconv
from audit._relations import load_relations
from audit._store import Store

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _constants() -> dict[str, object]:
    return {k: v for k, v in vars(semconv).items() if k.isupper() and not k.startswith("_")}


@pytest.mark.parametrize("name", sorted(_constants()))
def test_every_semconv_constant_is_documented(name: str) -> None:
    text = (DOCS / "semconv.md").read_text("utf-8")
    assert f"`{name}`" in text, f"{name} missing from docs/semconv.md"
    value = _constants()[name]
    if isinstance(value, str):
        assert f"`{value}`" in text, f"value {value!r} of {name} missing from docs/semconv.md"


def test_semconv_doc_sections_are_whole() -> None:
    """Each group of attributes is one section with one table (no stray or repeated headings)."""
    text = (DOCS / "semconv.md").read_text("utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert "None" not in headings
    assert len(headings) == len(set(headings)), [h for h in headings if headings.count(h) > 1]


def test_every_mart_column_is_documented(scenario_store: Store) -> None:
    text = (DOCS / "schema.md").read_text("utf-8")
    store = scenario_store
    if True:
        for rel in load_relations():
            if rel.layer != "marts":
                continue
            assert f"## {rel.name}" in text, rel.name
            section = text.split(f"## {rel.name}", 1)[1].split("\n## ", 1)[0]
            cols = query(store, f"select * from {rel.name} limit 0").columns
            documented = set(re.findall(r"`([a-z_0-9]+)`", section))
            missing = [c for c in cols if c not in documented]
            assert not missing, f"{rel.name}: undocumented columns {missing}"


def test_every_relation_has_a_yml() -> None:
    root = Path(__file__).resolve().parents[2] / "audit" / "sql"
    for layer in ("staging", "intermediate", "marts"):
        for sql in (root / layer).glob("*.sql"):
            yml = sql.with_suffix(".yml")
            assert yml.exists(), f"{yml} missing"
            assert "grain" in yml.read_text("utf-8"), yml
