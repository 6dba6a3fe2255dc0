"""Install the SQL relations (``audit/sql/{staging,intermediate,marts}``) as views.

Each relation is one ``.sql`` file holding a single ``select`` (dbt style: import CTEs first, last
line ``select * from final``); its name is the file's stem. Layers install in order, and inside a
layer a relation installs after the relations it names. Nothing is templated.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Final

import duckdb

LAYERS: Final = ("staging", "intermediate", "marts", "attribution")
"""Relation layers, in dependency order. ``attribution`` judges the marts: its ``int_*``
relations are internal steps, the others (``attributions``, ``slo_summary``, ``calibration``…)
are public like the marts."""

MARTS_DOC: Final = "docs/schema.md"


@dataclass(frozen=True)
class Relation:
    """One SQL relation: its name, layer and ``select`` text."""

    name: str
    layer: str
    sql: str


def load_relations() -> list[Relation]:
    """All relations, ordered so that each comes after the ones it reads."""
    root = resources.files("audit").joinpath("sql")
    found: list[Relation] = []
    for layer in LAYERS:
        folder = root.joinpath(layer)
        if not folder.is_dir():
            continue
        layer_rel = [
            Relation(entry.name[:-4], layer, entry.read_text("utf-8"))
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".sql")
        ]
        found.extend(_toposort(layer_rel, {r.name for r in found}))
    return found


def _toposort(rels: list[Relation], done: set[str]) -> list[Relation]:
    names = {r.name for r in rels}
    deps = {
        r.name: {n for n in names if n != r.name and re.search(rf"\b{re.escape(n)}\b", _strip_comments(r.sql))}
        for r in rels
    }
    ordered: list[Relation] = []
    placed = set(done)
    pending = list(rels)
    while pending:
        ready = [r for r in pending if deps[r.name] <= placed]
        if not ready:
            cycle = ", ".join(r.name for r in pending)
            raise RuntimeError(f"relations reference each other in a cycle: {cycle}")
        for r in ready:
            ordered.append(r)
            placed.add(r.name)
            pending.remove(r)
    return ordered


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def relations_version() -> str:
    """A hash of every relation's text: tells whether a store's views match this code."""
    h = hashlib.sha256()
    for r in load_relations():
        h.update(r.name.encode())
        h.update(r.sql.encode())
    return h.hexdigest()[:16]


def public_relations() -> list[str]:
    """Names users and dashboards may read: the marts and the public attribution relations."""
    return [
        r.name
        for r in load_relations()
        if r.layer == "marts" or (r.layer == "attribution" and not r.name.startswith("int_"))
    ]


def install(con: duckdb.DuckDBPyConnection, *, temporary: bool = False) -> None:
    """Create (or replace) every relation as a view on ``con``.

    ``temporary`` views live only on this connection: used by read-only readers whose store was
    written by another version of routeaudit.
    """
    kind = "temp view" if temporary else "view"
    for rel in load_relations():
        body = rel.sql.strip().rstrip(";")
        try:
            con.execute(f"create or replace {kind} {rel.name} as\n{body}")
        except duckdb.Error as exc:
            raise RuntimeError(f"relation {rel.layer}/{rel.name}.sql does not install: {exc}") from exc
