"""Build the SQL relations (``audit/sql/{staging,intermediate,marts}``).

Each relation is one ``.sql`` file holding a single ``select`` (dbt style: import CTEs first, last
line ``select * from final``) beside a ``.yml`` that gives its grain and checks; its name is the
file's stem. A relation builds after the relations it reads (:func:`reads`), whatever their
layer: the attribution's ``int_attr_*`` steps are intermediate relations that read the marts.
Nothing is templated.

Materialisation (dbt's ``table`` vs ``view``): a relation that reads a session variable
(``getvariable(...)``: the SLO targets and attribution thresholds), or reads such a relation, is
a **view**, so a reader's SLO applies at query time; so is one of :data:`ALWAYS_VIEWS` or
:data:`PROJECTION_VIEWS`. Every other relation is a **table**, rebuilt by :func:`refresh` in
dependency order. DuckDB plans a view by expanding every view beneath it, so a deep stack of
views costs seconds of planning per query; tables cut each plan to one step.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final

import duckdb

from audit._errors import StoreError

LAYERS: Final = ("staging", "intermediate", "marts")
"""Relation folders: ``staging`` (one per raw table or emitter dialect), ``intermediate``
(internal steps named by verb, the attribution's ``int_attr_*`` among them) and ``marts`` (the
public relations: ``requests``… and the attribution's ``attributions``, ``slo_summary``…).
Listed in the order ties are built in; what a relation reads always builds first."""

MARTS_DOC: Final = "docs/schema.md"


@dataclass(frozen=True)
class Relation:
    """One SQL relation: its name, layer and ``select`` text."""

    name: str
    layer: str
    sql: str


def load_relations() -> list[Relation]:
    """All relations, ordered so that each comes after the ones it reads (ties: layer, name)."""
    root = resources.files("audit").joinpath("sql")
    found: list[Relation] = []
    for layer in LAYERS:
        folder = root.joinpath(layer)
        if not folder.is_dir():
            continue
        found.extend(
            Relation(entry.name[:-4], layer, entry.read_text("utf-8"))
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".sql")
        )
    return _toposort(found)


def _toposort(rels: list[Relation]) -> list[Relation]:
    names = {r.name for r in rels}
    deps = {r.name: (reads(r.sql) & names) - {r.name} for r in rels}
    ordered: list[Relation] = []
    placed: set[str] = set()
    pending = list(rels)
    while pending:
        ready = next((r for r in pending if deps[r.name] <= placed), None)
        if ready is None:
            cycle = ", ".join(r.name for r in pending)
            raise StoreError(f"relations reference each other in a cycle: {cycle}")
        ordered.append(ready)
        placed.add(ready.name)
        pending.remove(ready)
    return ordered


_NOT_CODE = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/", re.S)
_CTE_NAME = re.compile(r"\b(\w+)\s*(?:\([^()]*\)\s*)?as\s+(?:not\s+)?(?:materialized\s+)?\(", re.I)
_FROM_NAME = re.compile(r"\b(?:from|join)\s+(\w+)", re.I)


@functools.lru_cache(maxsize=1024)
def _code(sql: str) -> str:
    """``sql`` without its comments and string literals (each relation's is asked for at every
    refresh, by every classification of the relations)."""
    return _NOT_CODE.sub(" ", sql)


def reads(sql: str) -> set[str]:
    """Names a relation's SQL reads from (after ``from`` or ``join``), less its own CTEs: a
    relation named in a comment, a string or a column qualifier is not read, and a CTE named
    like a relation shadows it."""
    return set(_reads(sql))


@functools.lru_cache(maxsize=1024)
def _reads(sql: str) -> frozenset[str]:
    # every read-only query checks the store's relations version, which orders the relations
    # by what they read: the regular expressions were a quarter of a small query's time
    code = _code(sql)
    return frozenset({n.lower() for n in _FROM_NAME.findall(code)}
                     - {n.lower() for n in _CTE_NAME.findall(code)})


def upstream(relations: list[Relation], names: set[str]) -> set[str]:
    """``names`` (those that are relations) and every relation they read, directly or through
    others."""
    by_name = {r.name: r for r in relations}
    found: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in found or name not in by_name:
            continue
        found.add(name)
        stack.extend(reads(by_name[name].sql))
    return found


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def relations_version() -> str:
    """A hash of every relation's text: tells whether a store's views match this code."""
    h = hashlib.sha256()
    h.update(b"cached-at-defaults-3")  # how refresh() materialises (bump when that changes)
    # how closed partitions are written: a store closed by an older form is rebuilt from raw rows
    h.update(b"closed-hugeint-as-decimal")
    for r in load_relations():
        h.update(r.name.encode())
        h.update(r.sql.encode())
    return h.hexdigest()[:16]


def public_relations() -> list[str]:
    """Names users and dashboards may read: the marts (the attribution's public relations among
    them) and :data:`ALWAYS_VIEWS`."""
    return [r.name for r in load_relations() if r.layer == "marts" or r.name in ALWAYS_VIEWS]


ALWAYS_VIEWS: Final = ("raw_span_attributes",)
"""Relations that stay views: they read only the raw tables (so they are never stale), no
relation reads them, and as tables they would copy every span at each refresh for the
occasional query by a person."""

PROJECTION_VIEWS: Final = ("stg_spans",)
"""Internal relations that stay views although other relations read them: each is a projection
of one raw table row by row (no join, no aggregate), so every reader computes only the columns
it reads, and storing all of them cost more than computing them again. ``stg_spans`` as a table
wrote 4M rows of 63 columns in a 1M-request refresh, 5.9 of its 10 s
(docs/performance.md, "Why a refresh costs what it does")."""


def views(relations: list[Relation]) -> set[str]:
    """Names of the relations stored as views (the rest are tables): the parametrised ones,
    :data:`ALWAYS_VIEWS` and :data:`PROJECTION_VIEWS`."""
    return parametrised(relations) | set(ALWAYS_VIEWS) | set(PROJECTION_VIEWS)


def parametrised(relations: list[Relation] | None = None) -> set[str]:
    """Names of relations that read session variables, directly or through another relation."""
    rels = load_relations() if relations is None else relations
    found: set[str] = set()
    for rel in rels:  # dependency order: a relation's inputs were classified before it
        if "getvariable(" in _code(rel.sql) or reads(rel.sql) & found:
            found.add(rel.name)
    return found


SCOPE_VARIABLES: Final = ("routeaudit_scope_run", "routeaudit_scope_request")
"""Session variables that only narrow a live computation to rows the cached tables also hold
(one run's or one request's; what is computed across requests is per run or read from tables),
so the cache stays valid whatever their value: they have no default and play no part in
choosing the cache."""

CACHE_SUFFIX: Final = "__cached"
LIVE_SUFFIX: Final = "__live"
_DEFAULTED_VARIABLE = re.compile(r"coalesce\(\s*getvariable\('(\w+)'\)\s*,\s*([-0-9.]+)\s*\)")


CACHED_INTERNAL: Final = ("int_attr_requests_placed", "int_attr_calibration_parts",
                           "int_slo_summary_parts")
"""Internal parametrised relations also materialised at the defaults. ``int_attr_requests_placed``
reads the thresholds but not the SLO, so its table serves every reader who changes only the SLO
(the dashboard's sidebar), and the public relations computed live for that reader read it instead
of re-assessing every candidate. ``int_attr_calibration_parts`` is calibration's summary per
partition: at the defaults a run's calibration merges its stored rows instead of re-assessing the
run's whole history; ``int_slo_summary_parts`` is the same for ``slo_summary``."""


def cached(relations: list[Relation] | None = None) -> list[str]:
    """Parametrised relations that :func:`refresh` also materialises at the default settings
    (``<name>__cached``) in a large store: the public ones (marts but ``slo_targets``, a
    single row computed from the variables alone), and :data:`CACHED_INTERNAL`.
    ``<name>`` reads that table while every session variable *it* reads (directly or through
    other relations, :func:`variables_read`) is unset or at its default, and computes live
    (``<name>__live``) otherwise."""
    rels = load_relations() if relations is None else relations
    param = parametrised(rels)
    return [r.name for r in rels
            if r.name in param
            and ((r.layer == "marts" and r.name != "slo_targets") or r.name in CACHED_INTERNAL)]


def variables_read(relations: list[Relation] | None = None) -> dict[str, set[str]]:
    """For each relation, the defaulted session variables it reads, directly or through the
    relations it reads: what its result can depend on."""
    rels = load_relations() if relations is None else relations
    found: dict[str, set[str]] = {}
    for rel in rels:  # dependency order: a relation's inputs were resolved before it
        own = {name for name, _ in _DEFAULTED_VARIABLE.findall(_strip_comments(rel.sql))}
        for other in reads(rel.sql):
            own |= found.get(other, set())
        found[rel.name] = own
    return found


def variable_defaults(relations: list[Relation] | None = None) -> dict[str, str]:
    """Every session variable the relations read, with the default the SQL gives it."""
    rels = load_relations() if relations is None else relations
    found: dict[str, str] = {}
    for rel in rels:
        for name, default in _DEFAULTED_VARIABLE.findall(_strip_comments(rel.sql)):
            found.setdefault(name, default)
    return found


CACHE_MIN_SPANS: Final = 100_000
"""Stores with at least this many spans get the cached relations (see :func:`refresh`); below
it the live views answer in well under a second and a cache would only slow every refresh."""


def refresh(con: duckdb.DuckDBPyConnection,
            on_built: Callable[[Relation, str, float], None] | None = None,
            cache_defaults: bool | None = None,
            before_commit: Callable[[duckdb.DuckDBPyConnection, int], None] | None = None) -> int:
    """Rebuild every relation in one transaction: tables for the plain ones, views for the
    parametrised ones. Readers see the old or the new set, never a mix. Returns the number of
    ``raw_spans`` rows the rebuilt relations read (the transaction's snapshot: spans committed
    meanwhile are not in them).

    The public parametrised relations (``attributions``, ``slow_requests``...) are also
    materialised at the default SLO and thresholds, the values a collector's readers use unless
    they choose others: at a million requests computing them took 7–13 s per query, reading the
    table milliseconds. Their view picks the table or the live computation by comparing the
    session variables with the defaults; DuckDB folds that comparison when planning, so the
    branch not taken costs nothing. Must run with no routeaudit session variable set.
    ``cache_defaults``: None caches from :data:`CACHE_MIN_SPANS` spans on.
    ``on_built(relation, kind, seconds)`` is called after each relation (benchmarks time them).
    ``before_commit(con, spans)`` runs in the transaction last, so what it writes (the store's
    record of this rebuild) is seen with the relations or not at all.
    """
    rels = load_relations()
    as_views = views(rels)
    at_defaults = _at_defaults(rels)
    con.execute("begin transaction")
    try:
        spans = int(con.sql("select count(*) from raw_spans").fetchall()[0][0])
        if cache_defaults is None:
            cache_defaults = spans >= CACHE_MIN_SPANS
        to_cache = set(cached(rels)) if cache_defaults else set()
        existing = _existing(con)
        same_sql = built_version(con) == relations_version()
        for rel in rels:
            started = time.perf_counter()
            kind = "view" if rel.name in as_views else "table"
            if same_sql and kind == "view" and _view_kept(con, rel.name, rel.name in to_cache,
                                                          existing):
                if on_built is not None:
                    on_built(rel, "kept view", time.perf_counter() - started)
                continue
            body = rel.sql.strip().rstrip(";")
            for name in (rel.name, rel.name + LIVE_SUFFIX, rel.name + CACHE_SUFFIX):
                _drop(con, name, existing)
            try:
                if rel.name in to_cache:
                    _create_cached(con, rel.name, body, at_defaults(rel.name))
                else:
                    con.execute(f"create {kind} {rel.name} as\n{body}")
            except duckdb.Error as exc:
                raise StoreError(
                    f"relation {rel.layer}/{rel.name}.sql does not build: {_first(exc)}") from exc
            if on_built is not None:
                on_built(rel, "cached view" if rel.name in to_cache else kind,
                         time.perf_counter() - started)
        if before_commit is not None:
            before_commit(con, spans)
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
    return spans


def built_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The :func:`relations_version` the store's relations were last built by, if recorded."""
    try:
        rows = con.execute("select value from routeaudit_meta "
                           "where key = 'relations_version'").fetchall()
    except duckdb.Error:
        return None
    return str(rows[0][0]) if rows else None


def _view_kept(con: duckdb.DuckDBPyConnection, name: str, cache: bool,
               existing: dict[str, str]) -> bool:
    """Keep relation ``name``'s view(s) as the last rebuild of the same SQL made them, when they
    are there in the form asked for (``cache``: the live view, the table at the defaults and
    the view picking one; else the view alone), and say so; a cached relation's table is
    recomputed. A view holds only its query, bound again by each reader, so recreating it
    would only bind it once more: a quarter of a small store's rebuild went to that."""
    live, table = name + LIVE_SUFFIX, name + CACHE_SUFFIX
    if existing.get(name) != "VIEW":
        return False
    if not cache:
        return live not in existing and table not in existing
    if existing.get(live) != "VIEW" or existing.get(table) != "BASE TABLE":
        return False
    _drop(con, table, existing)
    con.execute(f"create table {table} as select * from {live}")
    return True


def _at_defaults(rels: list[Relation]) -> Callable[[str], str]:
    """For a relation's name, the SQL condition "every session variable it reads is unset or at
    its default"."""
    defaults = variable_defaults(rels)
    reads = variables_read(rels)

    def at_defaults(name: str) -> str:
        return " and ".join(
            f"coalesce(getvariable('{var}'), {defaults[var]}) = {defaults[var]}"
            for var in sorted(reads[name])) or "true"
    return at_defaults


def _create_cached(con: duckdb.DuckDBPyConnection, name: str, body: str, cond: str) -> None:
    """Relation ``name`` as its live view, its table at the defaults, and the view that picks
    one of them by ``cond`` (:func:`refresh`)."""
    live, table = name + LIVE_SUFFIX, name + CACHE_SUFFIX
    con.execute(f"create view {live} as\n{body}")
    con.execute(f"create table {table} as select * from {live}")
    con.execute(f"create view {name} as\n"
                f"select * from {table} where {cond}\n"
                f"union all\nselect * from {live} where not ({cond})")


def has_cached(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store's relations include the tables at the defaults (:func:`cached`)."""
    names = [name + CACHE_SUFFIX for name in cached()]
    found = con.execute(
        "select count(*) from information_schema.tables where table_catalog = current_database() "
        "and table_schema = 'main' and table_name in (select unnest(?::varchar[]))",
        [names]).fetchall()[0][0]
    return int(found) == len(names)


def add_cached(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Materialise the cached relations at the defaults, in one transaction, on a store whose
    relations were built without them (small then, and refreshed by slices since, which keep
    the tables that exist up to date but never create one). Each is computed once over every
    row ``con`` reads (closed partitions included, where their views are installed); later
    slices maintain it. Returns the relations cached. Must run with no session variable set."""
    rels = load_relations()
    at_defaults = _at_defaults(rels)
    to_cache = set(cached(rels))
    made: list[str] = []
    con.execute("begin transaction")
    try:
        existing = _existing(con)
        for rel in rels:
            if rel.name not in to_cache:
                continue
            for name in (rel.name, rel.name + LIVE_SUFFIX, rel.name + CACHE_SUFFIX):
                _drop(con, name, existing)
            _create_cached(con, rel.name, rel.sql.strip().rstrip(";"), at_defaults(rel.name))
            made.append(rel.name)
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
    return made


def _existing(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The store's tables and views (name: ``VIEW`` or ``BASE TABLE``), read once: one lookup
    of ``information_schema`` per name took a tenth of the time of building every relation
    of an empty store."""
    return {str(name): str(kind) for name, kind in con.execute(
        "select table_name, table_type from information_schema.tables "
        "where table_catalog = current_database() and table_schema = 'main'").fetchall()}


def _drop(con: duckdb.DuckDBPyConnection, name: str, existing: dict[str, str]) -> None:
    kind = existing.pop(name, None)
    if kind is not None:
        con.execute(f"drop {'view' if kind == 'VIEW' else 'table'} {name}")


def install(con: duckdb.DuckDBPyConnection, *, temporary: bool = False) -> None:
    """Create every relation on ``con`` as :func:`refresh` does, without its cached tables:
    tables for the plain relations, views for the parametrised ones.

    ``temporary`` tables and views live only on this connection (and shadow the store's own):
    used by read-only readers whose store was written by another version of routeaudit, which
    cannot refresh it. Views throughout, as this was before, took 80 s to create even over
    empty raw tables, each view binding the whole stack beneath it (see the module docstring).
    """
    rels = load_relations()
    as_views = views(rels)
    for rel in rels:
        kind = ("temp " if temporary else "") + ("view" if rel.name in as_views else "table")
        body = rel.sql.strip().rstrip(";")
        try:
            con.execute(f"create or replace {kind} {rel.name} as\n{body}")
        except duckdb.Error as exc:
            raise StoreError(
                f"relation {rel.layer}/{rel.name}.sql does not install: {_first(exc)}") from exc


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
