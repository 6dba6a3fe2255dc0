"""Each relation's .yml describes it as built: its folder, its inputs, its columns in order with
their types, and checks that exist; every check is some relation's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from relation_rows import query

from audit._relations import LAYERS, load_relations, reads
from audit._store import Store
from audit.schema import RAW_TABLES

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "audit" / "sql"
RELATIONS = {r.name: r for r in load_relations()}


def _yml(name: str) -> dict[str, Any]:
    rel = RELATIONS[name]
    loaded: dict[str, Any] = yaml.safe_load((SQL / rel.layer / f"{name}.yml").read_text("utf-8"))
    return loaded


def test_every_relation_is_in_a_layer_folder_with_its_yml() -> None:
    assert {p.parent.name for p in SQL.glob("*/*.sql")} == {*LAYERS, "raw", "checks"}
    for layer in LAYERS:
        sql_stems = {p.stem for p in (SQL / layer).glob("*.sql")}
        yml_stems = {p.stem for p in (SQL / layer).glob("*.yml")}
        assert sql_stems == yml_stems, layer


@pytest.mark.parametrize("name", sorted(RELATIONS))
def test_yml_names_the_relation_its_layer_grain_and_inputs(name: str) -> None:
    doc = _yml(name)
    assert doc["name"] == name
    assert doc["layer"] == RELATIONS[name].layer
    assert isinstance(doc["grain"], str) and doc["grain"].startswith(("one row", "same grain"))
    assert isinstance(doc["description"], str) and doc["description"]
    known = set(RELATIONS) | set(RAW_TABLES)
    assert set(doc["inputs"]) == reads(RELATIONS[name].sql) & known
    for check in doc["checks"]:
        assert (ROOT / check).is_file(), check


def test_every_check_belongs_to_a_relation() -> None:
    named = {c for name in RELATIONS for c in _yml(name)["checks"]}
    on_disk = {f"audit/sql/checks/{p.name}" for p in (SQL / "checks").glob("*.sql")}
    assert on_disk == named


def test_yml_columns_are_the_relations_columns(scenario_store: Store) -> None:
    wrong = {}
    for name in RELATIONS:
        described = [(c["name"], c["type"]) for c in _yml(name)["columns"]]
        built = query(scenario_store, f"select column_name, column_type from (describe select * from {name})")
        actual = list(zip(built["column_name"], built["column_type"], strict=True))
        if described != actual:
            wrong[name] = ([c for c in actual if c not in described], [c for c in described if c not in actual])
    assert not wrong, f"relation: (columns missing from the yml, columns the relation lacks): {wrong}"


def test_marts_document_every_column() -> None:
    for name, rel in RELATIONS.items():
        if rel.layer == "marts":
            assert all(c.get("description") for c in _yml(name)["columns"]), name
