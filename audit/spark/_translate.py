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


def _is_star(node: exp.Expr) -> bool:
    return isinstance(node, exp.Star) or (isinstance(node, exp.Column)
                                           and isinstance(node.this, exp.Star))


def _qualify_with_star(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``select * ... qualify <condition over windows>``: Spark has no QUALIFY, and sqlglot's
    own rewrite (the windows as a column ``_w`` of a subquery, filtered outside it) leaves
    ``_w`` in the outer ``select *``: one column too many, in a row turned into a struct
    too. Here each window of the condition becomes a column ``__qualify_<i>`` of the
    subquery, and the outer select filters on them and drops them (``* except (...)``). The
    select's CTEs, order and limit move outside, where DuckDB applies them (after QUALIFY).
    A select listing its columns is left to sqlglot (its outer select lists them too)."""
    selects = [s for s in tree.find_all(exp.Select, bfs=True)
               if s.args.get("qualify") is not None and any(_is_star(p) for p in s.expressions)]
    for select in reversed(selects):
        qualify = select.args["qualify"]
        names: list[str] = []

        def lift(node: exp.Expr, select: exp.Select = select, names: list[str] = names) -> exp.Expr:
            if isinstance(node, exp.Window):
                name = f"__qualify_{len(names)}"
                names.append(name)
                select.select(exp.alias_(node.copy(), name), copy=False)
                return exp.column(name)
            if isinstance(node, exp.Column) and node.table:
                return exp.column(node.name)
            return node

        condition = qualify.this.copy().transform(lift)
        select.set("qualify", None)
        moved = {key: select.args.get(key) for key in ("with_", "order", "limit", "offset")}
        for key in moved:
            select.set(key, None)
        outer = exp.Select(expressions=[exp.Star(except_=[exp.column(n) for n in names])])
        select.replace(outer)
        outer.set("from_", exp.From(this=exp.Subquery(
            this=select, alias=exp.TableAlias(this=exp.to_identifier("__qualified")))))
        outer.set("where", exp.Where(this=condition))
        for key, value in moved.items():
            if value is not None:
                if key == "order":
                    value = value.transform(lambda n: exp.column(n.name)
                                            if isinstance(n, exp.Column) and n.table else n)
                outer.set(key, value)
        if select is tree:
            tree = outer
    return tree


def _row_as_struct(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """A table alias selected as a column (``select client from ... as client``) is the row
    as a struct in DuckDB (all fields NULL when an outer join found no row); Spark:
    ``struct(client.*) as client``, the same. Only a bare name in a select's list that is
    an alias of that select's FROM or JOIN."""
    for select in tree.find_all(exp.Select):
        from_ = select.args.get("from_")
        sources = [from_.this] if isinstance(from_, exp.From) else []
        sources += [j.this for j in select.args.get("joins") or []]
        aliases = {t.alias_or_name for t in sources}
        for projection in list(select.expressions):
            if isinstance(projection, exp.Column) and not projection.table \
                    and isinstance(projection.this, exp.Identifier) \
                    and projection.name in aliases:
                row = exp.Column(this=exp.Star(), table=exp.to_identifier(projection.name))
                projection.replace(exp.alias_(exp.Struct(expressions=[row]), projection.name))
    return tree


_INTERVAL_UNITS: Final = {"to_microseconds": "0.000001", "to_milliseconds": "0.001",
                          "to_seconds": "1"}


def _interval_functions(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``to_microseconds(n)`` (and ``to_milliseconds``, ``to_seconds``): an interval of ``n``
    units, added to timestamps. Spark: ``n * interval '0.000001' second`` (a day-time
    interval; an integral ``n`` multiplies its microseconds exactly)."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and node.name.lower() in _INTERVAL_UNITS \
                and len(node.expressions) == 1:
            unit = exp.Interval(this=exp.Literal.string(_INTERVAL_UNITS[node.name.lower()]),
                                unit=exp.var("SECOND"))
            return exp.Paren(this=exp.Mul(this=exp.Paren(this=node.expressions[0].copy()),
                                          expression=unit))
        return node

    return tree.transform(swap)


def _star_replace(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``r.* replace (expr as c, ...)``: Spark has no REPLACE; ``r.* except (c, ...), expr as
    c, ...`` gives the same columns and values, the replaced ones moved after the others
    (the relations name their columns; none is read by position)."""
    for select in tree.find_all(exp.Select):
        items: list[exp.Expr] = []
        changed = False
        for projection in select.expressions:
            star = projection.this if isinstance(projection, exp.Column) else projection
            replaced = star.args.get("replace") if isinstance(star, exp.Star) else None
            if not replaced:
                items.append(projection)
                continue
            changed = True
            kept = projection.copy()
            kept_star = kept.this if isinstance(kept, exp.Column) else kept
            kept_star.set("replace", None)
            dropped = list(kept_star.args.get("except_") or [])
            dropped += [exp.column(r.alias_or_name) for r in replaced]
            kept_star.set("except_", dropped)
            items.append(kept)
            items.extend(r.copy() for r in replaced)
        if changed:
            select.set("expressions", items)
    return tree


def _list_quantile(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``list_aggregate(list, 'quantile_cont', q)``: the interpolated quantile of a list's
    non-NULL values (NULL for none). Spark has no aggregate over an array; over the sorted
    values ``a`` (1-based) with ``p = q * (size(a) - 1)``:
    ``a[floor(p) + 1] + (p - floor(p)) * (a[ceil(p) + 1] - a[floor(p) + 1])``, DuckDB's
    interpolation."""

    def swap(node: exp.Expr) -> exp.Expr:
        if not (isinstance(node, exp.Anonymous) and node.name.lower() == "list_aggregate"
                and len(node.expressions) == 3):
            return node
        values, function, q = node.expressions
        if not (isinstance(function, exp.Literal) and function.is_string
                and function.this.lower() == "quantile_cont"):
            raise ValueError(f"list_aggregate(..., {function.sql()}) is not translated")
        a = f"array_sort(filter({_spark(values)}, v -> v is not null))"
        p = f"(cast({_spark(q)} as double) * (size({a}) - 1))"
        lo = f"element_at({a}, cast(floor({p}) as int) + 1)"
        hi = f"element_at({a}, cast(ceil({p}) as int) + 1)"
        return sqlglot.parse_one(
            f"(case when size({a}) > 0 then {lo} + ({p} - floor({p})) * ({hi} - {lo}) end)",
            read="spark")

    return tree.transform(swap)


_INTEGER_TYPES: Final = frozenset({exp.DataType.Type.BIGINT, exp.DataType.Type.INT,
                                   exp.DataType.Type.SMALLINT, exp.DataType.Type.TINYINT})


def _visibly_double(node: exp.Expr) -> bool:
    """Whether DuckDB types ``node`` as a double whatever its columns' types: arithmetic (through
    parentheses, CASE branches, coalesce) over a ``/`` (DuckDB's division always gives a double)
    or a literal in scientific notation (a double literal)."""
    if isinstance(node, exp.Div):
        return True
    if isinstance(node, exp.Literal):
        return not node.is_string and "e" in node.this.lower()
    if isinstance(node, exp.Paren | exp.Neg):
        return _visibly_double(node.this)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul):
        return _visibly_double(node.this) or _visibly_double(node.expression)
    if isinstance(node, exp.Case):
        branches = [i.args["true"] for i in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            branches.append(node.args["default"])
        return any(_visibly_double(b) for b in branches)
    if isinstance(node, exp.Coalesce):
        return any(_visibly_double(e) for e in [node.this, *node.expressions])
    return False


def _rounding_casts(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``cast(x as bigint)`` (or another integer type) of a double: DuckDB rounds to the nearest
    (ties to even), Spark truncates. Spark: ``cast(rint(x) as bigint)``, for the casts whose
    operand is visibly a double (a division, a double literal; see :func:`_visibly_double`).
    A cast of a column or of an expression of unknown type is left as it is."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Cast) and node.to.this in _INTEGER_TYPES \
                and _visibly_double(node.this):
            node.set("this", exp.Anonymous(this="rint", expressions=[node.this.copy()]))
        return node

    return tree.transform(swap)


REWRITES: Final[dict[str, Rewrite]] = {
    "session_variables": _session_variables,
    "cte_materialisation": _cte_materialisation,
    "distinct_list_window": _distinct_list_window,
    "epoch_conversions": _epoch_conversions,
    "aggregates": _aggregates,
    "qualify_with_star": _qualify_with_star,
    "row_as_struct": _row_as_struct,
    "interval_functions": _interval_functions,
    "star_replace": _star_replace,
    "list_quantile": _list_quantile,
    "rounding_casts": _rounding_casts,
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
