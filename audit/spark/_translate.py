"""Translate a relation's DuckDB SQL into Spark SQL, mechanically.

The ``.sql`` files stay the one source of truth: each is parsed with sqlglot in DuckDB's dialect,
passed through the few named rewrites below (transforms of the sqlglot tree, each for one
DuckDB construct sqlglot does not carry over by itself), and generated in Spark's dialect. No
relation has a hand-written Spark copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import sqlglot
from sqlglot import exp

Rewrite = Callable[[exp.Expr, Mapping[str, str]], exp.Expr]


def _session_variables(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``getvariable('name')`` (the SLO targets and attribution thresholds a DuckDB reader sets
    per session) becomes the value in ``settings``, or NULL: the SQL's own
    ``coalesce(getvariable(..), default)`` then gives the default, as in a DuckDB session
    that set nothing."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and node.name.lower() == "getvariable":
            arg = node.expressions[0] if node.expressions else None
            name = arg.name if isinstance(arg, exp.Literal) else ""
            if name in settings:
                return sqlglot.parse_one(settings[name], read="duckdb")
            return exp.Null()
        return node

    return tree.transform(swap)


def _cte_materialisation(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``name as [not] materialized (...)``: a DuckDB planning hint Spark's grammar lacks (Spark
    plans every CTE itself); dropped."""
    for cte in tree.find_all(exp.CTE):
        cte.set("materialized", None)
    return tree


def _distinct_list_window(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``list(distinct x) over (...)``: Spark has no DISTINCT in a window aggregate; its
    ``collect_set(x) over (...)`` gives the same elements (a DuckDB list of distinct values
    has no defined order either)."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Window) and isinstance(node.this, exp.ArrayAgg) \
                and isinstance(node.this.this, exp.Distinct):
            values = node.this.this.expressions
            if len(values) == 1:
                node.set("this", exp.Anonymous(this="collect_set", expressions=[values[0].copy()]))
        return node

    return tree.transform(swap)


def _epoch_conversions(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``to_timestamp(seconds)`` and ``epoch_us(ts)``. DuckDB's ``to_timestamp`` takes the
    microseconds to the nearest (``seconds * 1e6`` cast to bigint, which rounds); sqlglot's
    Spark form goes through a string of whole seconds. Spark: ``timestamp_micros(cast(rint(
    seconds * 1e6) as bigint))`` (rint: nearest, ties to even) and ``unix_micros(ts)``."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.UnixToTime) and node.args.get("scale") is None:
            micros = exp.Mul(this=exp.Paren(this=node.this.copy()),
                             expression=exp.Literal.number("1e6"))
            rounded = exp.Anonymous(this="rint", expressions=[micros])
            return exp.Anonymous(this="timestamp_micros",
                                 expressions=[exp.cast(rounded, "bigint")])
        if isinstance(node, exp.Anonymous) and node.name.lower() == "epoch_us":
            return exp.Anonymous(this="unix_micros", expressions=[e.copy() for e in node.expressions])
        return node

    return tree.transform(swap)


def _aggregates(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """Aggregates named or shaped differently: ``quantile_cont(x, q)`` is Spark's
    ``percentile(x, q)`` (exact, interpolated); ``len(list)`` is ``size(list)``; an ordered
    ``list(x order by k)`` is the ``x`` of ``array_sort(collect_list(struct(k, x)))`` (Spark's
    ``collect_list`` takes no order)."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.PercentileCont) and node.expression is not None:
            return exp.Anonymous(this="percentile",
                                 expressions=[node.this.copy(), node.expression.copy()])
        if isinstance(node, exp.Length):
            return exp.Anonymous(this="size", expressions=[node.this.copy()])
        if isinstance(node, exp.ArrayAgg) and isinstance(node.this, exp.Order):
            order = node.this
            keys = [o.this.copy() for o in order.expressions]
            if any(o.args.get("desc") for o in order.expressions):
                raise ValueError("list(... order by ... desc) is not translated")
            fields = [exp.PropertyEQ(this=exp.to_identifier(f"k{i}"), expression=k)
                      for i, k in enumerate(keys)]
            fields.append(exp.PropertyEQ(this=exp.to_identifier("v"),
                                         expression=order.this.copy()))
            sorted_ = exp.Anonymous(this="array_sort", expressions=[exp.Anonymous(
                this="collect_list", expressions=[exp.Struct(expressions=fields)])])
            return sqlglot.parse_one(
                f"transform({sorted_.sql(dialect='spark')}, s -> s.v)", read="spark")
        return node

    return tree.transform(swap)


REWRITES: Final[dict[str, Rewrite]] = {
    "session_variables": _session_variables,
    "cte_materialisation": _cte_materialisation,
    "distinct_list_window": _distinct_list_window,
    "epoch_conversions": _epoch_conversions,
    "aggregates": _aggregates,
}
"""The engine-specific pieces, by name, applied in this order (docs/scale-out.md)."""


@dataclass(frozen=True)
class Recursion:
    """A recursive CTE evaluated level by level (the ``recursive_cte_levels`` rewrite): the
    runner builds ``anchor`` as level 0, then ``step`` over the view ``<view>_prev`` (the
    previous level) until a level is empty, and registers the union of the levels as
    ``<view>_all``, which the relation's query reads in place of the CTE. This is DuckDB's own
    semantics (each iteration reads the rows the previous one produced); Spark's recursive CTEs
    refuse the window functions such a step may use (a breadth-first walk keeps one row per
    reached node)."""

    view: str
    anchor: str
    step: str


@dataclass(frozen=True)
class Translation:
    """A relation in Spark SQL: its recursions to evaluate first, then its query."""

    recursions: tuple[Recursion, ...]
    sql: str


def _spark(tree: exp.Expr) -> str:
    return tree.sql(dialect="spark", unsupported_level=sqlglot.ErrorLevel.RAISE)


def _recursive_cte_levels(tree: exp.Expr, name: str) -> tuple[exp.Expr,
                                                                      list[Recursion]]:
    with_ = tree.args.get("with_")
    if not isinstance(with_, exp.With) or not with_.args.get("recursive"):
        return tree, []
    found: list[Recursion] = []
    ctes = list(with_.expressions)
    for i, cte in enumerate(ctes):
        body = cte.this
        own = cte.alias_or_name
        if not isinstance(body, exp.Union) or not any(
                t.name == own and not t.db for t in body.expression.find_all(exp.Table)):
            continue
        if body.args.get("distinct"):
            raise ValueError(f"{name}: recursive CTE {own} is a union, not a union all")
        view = f"__{name}__{own}"
        earlier = [c.copy() for c in ctes[:i]]
        anchor = body.this.copy()
        step = body.expression.copy()
        for table in list(step.find_all(exp.Table)):
            if table.name == own and not table.db:
                alias = table.alias or own
                table.replace(exp.to_table(f"{view}_prev").as_(alias))
        for part in (anchor, step):
            if earlier:
                part.set("with_", exp.With(expressions=[c.copy() for c in earlier]))
        found.append(Recursion(view, _spark(anchor), _spark(step)))
        cte.set("this", sqlglot.parse_one(f"select * from {view}_all", read="duckdb"))
    with_.set("recursive", None)
    return tree, found


def translate(sql: str, name: str = "relation",
              settings: Mapping[str, str] | None = None) -> Translation:
    """One relation's ``select`` in Spark SQL (``name``: the relation's, for the names of the
    views its recursions use)."""
    tree = sqlglot.parse_one(sql.strip().rstrip(";"), read="duckdb")
    for rewrite in REWRITES.values():
        tree = rewrite(tree, settings or {})
    tree, recursions = _recursive_cte_levels(tree, name)
    return Translation(tuple(recursions), _spark(tree))


def to_spark(sql: str, settings: Mapping[str, str] | None = None) -> str:
    """One relation's ``select`` in Spark SQL, for a relation without recursive CTEs."""
    translation = translate(sql, settings=settings)
    if translation.recursions:
        raise ValueError("the relation has recursive CTEs: use translate()")
    return translation.sql
