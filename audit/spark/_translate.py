"""Translate a relation's DuckDB SQL into Spark SQL, mechanically.

The ``.sql`` files stay the one source of truth: each is parsed with sqlglot in DuckDB's dialect,
passed through the few named rewrites below (transforms of the sqlglot tree, each for one
DuckDB construct sqlglot does not carry over by itself), and generated in Spark's dialect. No
relation has a hand-written Spark copy.
"""

from __future__ import annotations

import re
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


def _md5_number(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``md5_number(s) >> n`` (``2 <= n <= 64``): the MD5 digest of ``s`` read as an unsigned
    128-bit integer, little-endian (DuckDB's ``md5_number``), shifted right by ``n``. Spark has
    no 128-bit integer; the shifted value is below ``2^126 < 10^38`` and so fits, exactly, a
    ``decimal(38,0)``: the digest's bytes reversed into big-endian hex, its high 64 bits times
    ``2^(64-n)`` plus its low 64 bits shifted right by ``n``. Equal keys stay equal and their
    order is the integers' order, so joins and sorts over the key give DuckDB's rows. An
    unshifted ``md5_number`` (up to ``2^128``) does not fit and is refused."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and node.name.lower() == "md5_number":
            parent = node.parent
            shift = parent.expression if isinstance(parent, exp.BitwiseRightShift) \
                and parent.this is node else None
            if not (isinstance(shift, exp.Literal) and not shift.is_string
                    and 2 <= int(shift.this) <= 64):
                raise ValueError("md5_number(...) is translated only shifted right by 2 to 64")
        if not (isinstance(node, exp.BitwiseRightShift) and isinstance(node.this, exp.Anonymous)
                and node.this.name.lower() == "md5_number"):
            return node
        n = int(node.expression.this)
        value = _spark(node.this.expressions[0])
        be = f"array_join(reverse(regexp_extract_all(md5(cast({value} as string)), '(..)', 1)), '')"
        hi = f"cast(conv(substr({be}, 1, 16), 16, 10) as decimal(20,0))"
        lo = f"shiftrightunsigned(cast(conv(substr({be}, 17, 16), 16, -10) as bigint), {n})"
        return sqlglot.parse_one(
            f"cast({hi} * cast({2 ** (64 - n)} as decimal(20,0)) + {lo} as decimal(38,0))",
            read="spark")

    return tree.transform(swap)


def _folded_key_parts(node: exp.Expr) -> tuple[exp.Expr, exp.Expr] | None:
    """``(cast(hash(g, ...) >> 2 as hugeint) << 64) + t``: (the ``hash(...) >> 2``, ``t``)."""
    if not isinstance(node, exp.Add):
        return None
    high = node.this.this if isinstance(node.this, exp.Paren) else node.this
    if not (isinstance(high, exp.BitwiseLeftShift) and isinstance(high.expression, exp.Literal)
            and high.expression.this == "64" and isinstance(high.this, exp.Cast)
            and high.this.to.this == exp.DataType.Type.INT128):
        return None
    hashed = high.this.this
    if not (isinstance(hashed, exp.BitwiseRightShift) and isinstance(hashed.this, exp.Anonymous)
            and hashed.this.name.lower() == "hash"):
        return None
    return hashed, node.expression


def _is_folded_pair(node: exp.Expr) -> bool:
    """A folded key as :func:`_folded_keys` writes it for Spark."""
    return isinstance(node, exp.Anonymous) and node.name.lower() == "named_struct" \
        and len(node.expressions) == 4 and node.expressions[0] == exp.Literal.string("hi") \
        and isinstance(node.expressions[1], exp.Anonymous) \
        and node.expressions[1].name.lower() == "shiftrightunsigned"


def _folded_key_names(tree: exp.Expr) -> set[str]:
    """The names of the folded keys a relation computes (in either form)."""
    return {a.alias for a in tree.find_all(exp.Alias)
            if _folded_key_parts(a.this) is not None or _is_folded_pair(a.this)}


def _folded_keys(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``(cast(hash(g, ...) >> 2 as hugeint) << 64) + t``: a group (a replica, a replica and a
    block) and an instant folded into one orderable 126-bit key, so that a range or ASOF join
    over the key is a join within the group ordered by time. Spark: the pair
    ``named_struct('hi', shiftrightunsigned(xxhash64(g, ...), 2), 'lo', t)``; structs compare
    field by field, so the pair orders as the integer does (``0 <= t < 2^64``). Spark's hash
    is not DuckDB's: the groups' keys differ, not which rows share a group (the relations
    re-check the group after each such join, a hash collision cannot mix groups), and the
    joins (``folded_range_joins``, ``asof_joins``) keep to a group."""

    def swap(node: exp.Expr) -> exp.Expr:
        parts = _folded_key_parts(node)
        if parts is None:
            return node
        hashed, instant = parts
        spark_hash = exp.Anonymous(this="xxhash64",
                                   expressions=[e.copy() for e in hashed.this.expressions])
        hi = exp.Anonymous(this="shiftrightunsigned",
                           expressions=[spark_hash, hashed.expression.copy()])
        return exp.Anonymous(this="named_struct", expressions=[
            exp.Literal.string("hi"), hi, exp.Literal.string("lo"), instant.copy()])

    return tree.transform(swap)


def _hashes(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``hash(x, ...)`` outside a folded key (a row's fingerprint, summed per block to find the
    blocks that share one service history): DuckDB's is 64 bits, Spark's ``hash`` 32, too few
    for a fingerprint; Spark's ``xxhash64(x, ...)`` is 64. The values differ between the
    engines, not which rows hash alike, so the classes they find are the same."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and node.name.lower() == "hash":
            return exp.Anonymous(this="xxhash64", expressions=[e.copy() for e in node.expressions])
        return node

    return tree.transform(swap)


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    return [node]


_FLIP: Final[dict[type[exp.Expr], type[exp.Expr]]] = {exp.GT: exp.LT, exp.GTE: exp.LTE,
                                                  exp.LT: exp.GT, exp.LTE: exp.GTE}


RANGE_BUCKET_US: int = 10_000_000
"""The width, in microseconds, of the time buckets a folded range join is keyed by."""


def _micro_folded_names(tree: exp.Expr) -> set[str]:
    """The folded keys whose instant is ``epoch_us(...)``: microseconds, bucketable by
    :data:`RANGE_BUCKET_US`."""
    found = set()
    for a in tree.find_all(exp.Alias):
        parts = _folded_key_parts(a.this)
        instant = parts[1] if parts is not None else (
            a.this.expressions[3] if _is_folded_pair(a.this) else None)
        if isinstance(instant, exp.Anonymous) and instant.name.lower() == "epoch_us":
            found.add(a.alias)
    return found


def _range_bucketed(join: exp.Join, interval: str, low: str, high: str, point: exp.Column,
                    micro: set[str]) -> bool:
    """Key the join by time bucket as well (see :func:`_folded_range_joins`); whether it did."""
    select = join.parent
    target = join.this
    side = (join.args.get("side") or "").upper()
    if not isinstance(select, exp.Select) or target.alias_or_name != interval \
            or side not in ("", "LEFT") or not {low, high, point.name} <= micro:
        return False
    for star in (n for p in select.expressions for n in p.find_all(exp.Star)):
        column = star.parent if isinstance(star.parent, exp.Column) else None
        if column is None or not column.table or column.table == interval:
            return False  # the bucket column would be one column too many in a ``*``
    if any(isinstance(p, exp.Column) and not p.table and p.name == interval
           for p in select.expressions):
        return False  # the row as a struct (``row_as_struct``) would take it too
    source = target.copy()
    source.set("alias", exp.TableAlias(this=exp.to_identifier("__range_src")))
    w = RANGE_BUCKET_US
    bucketed = sqlglot.parse_one(
        f"select __range_src.*, explode(sequence(__range_src.{low}.lo div {w}, "
        f"__range_src.{high}.lo div {w})) as __range_bucket from __range_placeholder",
        read="spark")
    bucketed.args["from_"].this.replace(source)
    target.replace(exp.Subquery(this=bucketed, alias=exp.TableAlias(
        this=exp.to_identifier(interval))))
    same = sqlglot.parse_one(
        f"{interval}.__range_bucket = {point.table}.{point.name}.lo div {w}", read="spark")
    join.set("on", exp.And(this=same, expression=join.args["on"].copy()))
    return True


def _folded_range_joins(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """A join whose condition bounds one side's folded key by the other's in both directions
    (``a.start_key <= b.at_key and a.end_key > b.at_key``): with each row's keys in one group,
    that already implies the two rows' groups are equal. Spark: that implied equality
    (``a.start_key.hi = b.at_key.hi``) is added to the condition, so Spark plans a join on the
    group filtered by the range, as DuckDB's IEJoin is, instead of comparing every pair.

    A group alone is a replica: every execution of a replica against every instant on it, a
    number of pairs growing with the square of the run's length. Where the keys' instants are
    microseconds (``epoch_us``), the interval side (the joined table, not the preserved side of
    an outer join) is also spread over the time buckets of :data:`RANGE_BUCKET_US` it overlaps
    (``explode(sequence(start div w, end div w))``) and the join keyed by the point's bucket: a
    pair within the range shares exactly one bucket (the point's), so each pair is found once
    and the rows are the same. Not where a ``*`` of the select could take the bucket column."""
    names = _folded_key_names(tree)
    micro = _micro_folded_names(tree)
    for join in list(tree.find_all(exp.Join)):
        on = join.args.get("on")
        if on is None or not names:
            continue
        directions: dict[tuple[str, str], set[str]] = {}
        columns: dict[tuple[str, str], tuple[exp.Column, exp.Column]] = {}
        below: dict[tuple[str, str], list[tuple[exp.Column, exp.Column]]] = {}
        for c in _conjuncts(on):
            if type(c) not in _FLIP:
                continue
            a, b = c.this, c.expression
            if not (isinstance(a, exp.Column) and isinstance(b, exp.Column) and a.table
                    and b.table and a.table != b.table and a.name in names and b.name in names):
                continue
            kind = type(c)
            below.setdefault((min(a.table, b.table), max(a.table, b.table)), []).append(
                (a, b) if kind in (exp.LT, exp.LTE) else (b, a))
            if a.table > b.table:
                a, b, kind = b, a, _FLIP[kind]
            pair = (a.table, b.table)
            directions.setdefault(pair, set()).add(
                "up" if kind in (exp.LT, exp.LTE) else "down")
            columns.setdefault(pair, (a, b))
        for pair, seen in directions.items():
            if seen != {"up", "down"}:
                continue
            a, b = columns[pair]
            same = sqlglot.parse_one(f"{a.table}.{a.name}.hi = {b.table}.{b.name}.hi",
                                     read="spark")
            join.set("on", exp.And(this=same, expression=on.copy()))
            on = join.args["on"]
            # the interval: the table one of whose keys is below the other's and one above
            for interval in pair:
                lows = {lo.name for lo, hi in below[pair] if lo.table == interval}
                highs = {hi.name for lo, hi in below[pair] if hi.table == interval}
                # a point: one column of the other table, above the low and below the high
                # (two intervals overlapping bound each other's ends: not a point)
                points = [hi for lo, hi in below[pair] if lo.table == interval] + [
                    lo for lo, hi in below[pair] if hi.table == interval]
                if len(lows) == 1 and len(highs) == 1 and lows != highs and len(
                        {p.name for p in points}) == 1:
                    if _range_bucketed(join, interval, lows.pop(), highs.pop(), points[0],
                                       micro):
                        on = join.args["on"]
                    break
    return tree


def _asof_joins(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``from l asof [left] join r on l.g = r.g and l.t >= r.t``: each row of ``l`` with the row
    of ``r`` in its group (the equalities) that has the greatest ``r.t`` at or before ``l.t``
    (``>``: before), NULLs for none (an inner ASOF join drops the row). Spark has no ASOF join:
    both sides as one sorted stream, ``l``'s rows as ``struct(l.*)`` and ``r``'s as
    ``struct(r.*)``, partitioned by the group and ordered by the instant (at a tie ``r``'s row
    first for ``>=``, last for ``>``); each ``l`` row takes the last ``r`` struct before it
    (``last(..., true)``, one pass, no pairs compared). The select then reads ``l`` and ``r`` as
    struct columns of the same names, so ``l.c`` and ``r.*`` read as before. A row of either
    side with a NULL key or group matches nothing, as in DuckDB. Over a folded key (see
    ``folded_keys``) the group is the key's ``hi``: DuckDB would take, for a row whose group has
    no earlier row, the last row of the group ordered before it, and every such join in the
    relations discards a match of another group (it re-checks replica and block); Spark finds
    none. The ASOF join must be the select's first join."""
    names = _folded_key_names(tree)
    for select in list(tree.find_all(exp.Select)):
        joins = select.args.get("joins") or []
        asof = [j for j in joins if (j.args.get("method") or "").upper() == "ASOF"]
        if not asof:
            continue
        if joins[0] is not asof[0] or len(asof) > 1:
            raise ValueError("an ASOF join is translated only as a select's first join")
        join = asof[0]
        left_src = select.args["from_"].this
        right_src = join.this
        la, ra = left_src.alias_or_name, right_src.alias_or_name
        groups: list[tuple[exp.Expr, exp.Expr]] = []
        bound: tuple[exp.Expr, exp.Expr, bool] | None = None
        for c in _conjuncts(join.args["on"]):
            sides = {t.table for t in c.find_all(exp.Column)}
            a, b = c.this, c.expression
            a_left = {t.table for t in a.find_all(exp.Column)} <= {la}
            if isinstance(c, exp.EQ):
                groups.append((a, b) if a_left else (b, a))
                continue
            if type(c) not in _FLIP or bound is not None or sides != {la, ra}:
                raise ValueError(f"ASOF condition not translated: {c.sql()}")
            kind = type(c) if a_left else _FLIP[type(c)]
            left_t, right_t = (a, b) if a_left else (b, a)
            if kind not in (exp.GTE, exp.GT):
                raise ValueError(f"ASOF condition not translated: {c.sql()}")
            bound = (left_t, right_t, kind is exp.GTE)
        if bound is None:
            raise ValueError("ASOF join without an inequality")
        left_t, right_t, inclusive = bound
        folded = isinstance(left_t, exp.Column) and left_t.name in names \
            and isinstance(right_t, exp.Column) and right_t.name in names
        n = len(groups)
        gcols = ", ".join(f"__asof_g{i}" for i in range(n))
        left_sel = ", ".join([f"struct({la}.*) as __asof_l", "null as __asof_r",
                              *(f"{_spark(g[0])} as __asof_g{i}" for i, g in enumerate(groups)),
                              f"{_spark(left_t)} as __asof_k", "1 as __asof_side"])
        right_sel = ", ".join(["null as __asof_l", f"struct({ra}.*) as __asof_r",
                               *(f"{_spark(g[1])} as __asof_g{i}" for i, g in enumerate(groups)),
                               f"{_spark(right_t)} as __asof_k",
                               f"{0 if inclusive else 2} as __asof_side"])
        not_null = " and ".join([f"{_spark(right_t)} is not null",
                                 *(f"{_spark(g[1])} is not null" for g in groups)])
        partition = [gcols] if n else []
        if folded:
            partition.append("__asof_k.hi")
        over = (f"over ({'partition by ' + ', '.join(partition) if partition else ''} "
                "order by __asof_k, __asof_side rows between unbounded preceding and current row)")
        match = f"case when __asof_k is not null then last(__asof_r, true) {over} end"
        keep = "__asof_side = 1" + ("" if join.args.get("side") else " and __asof_m is not null")
        union = (f"select {left_sel} from {_spark(left_src)} union all "
                 f"select {right_sel} from {_spark(right_src)} where {not_null}")
        derived = sqlglot.parse_one(
            f"select __asof_l as {la}, __asof_m as {ra} from (select __asof_l, __asof_side, "
            f"{match} as __asof_m from ({union}) as __asof_u) as __asof_w where {keep}",
            read="spark")
        select.set("from_", exp.From(this=exp.Subquery(
            this=derived, alias=exp.TableAlias(this=exp.to_identifier(f"__asof_{la}_{ra}")))))
        select.set("joins", joins[1:] or None)
    return tree


def _hugeint(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``cast(x as hugeint)`` (a sum's accumulator, a key): Spark has no 128-bit integer;
    ``decimal(38,0)`` holds every integer below ``10^38`` exactly, and sums, products and
    comparisons of such integers give the same numbers (the relations' 128-bit values are
    sums of token counts and products of two of them, far below ``10^38``)."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.DataType) and node.this == exp.DataType.Type.INT128:
            return exp.DataType.build("decimal(38,0)")
        return node

    return tree.transform(swap)


def _output_names(query: exp.Expr, ctes: Mapping[str, exp.Expr]) -> list[str] | None:
    """The column names a select gives, when its text says them: each projection named, or
    ``select * from <cte>`` of a CTE whose columns are known so."""
    if not isinstance(query, exp.Select):
        return None
    if len(query.expressions) == 1 and _is_star(query.expressions[0]):
        from_ = query.args.get("from_")
        source = from_.this if isinstance(from_, exp.From) else None
        if isinstance(source, exp.Table) and not query.args.get("joins") \
                and source.name in ctes:
            return _output_names(ctes[source.name], ctes)
        return None
    if any(_is_star(p) for p in query.expressions):
        return None
    return [p.alias_or_name for p in query.expressions]


def _union_by_name(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``a union all by name b``: Spark's SQL has no BY NAME. Where both sides' columns are
    known from the text (named projections, or ``select *`` of such a CTE), each side becomes
    a select of the columns in DuckDB's order (``a``'s, then those only ``b`` has), a column a
    side lacks as NULL."""
    ctes = {c.alias_or_name: c.this for c in tree.find_all(exp.CTE)}
    for union in list(tree.find_all(exp.Union)):
        if not union.args.get("by_name"):
            continue
        left, right = _output_names(union.this, ctes), _output_names(union.expression, ctes)
        if left is None or right is None:
            raise ValueError("union by name over columns not named in the text")
        order = left + [n for n in right if n not in left]
        for key, have in (("this", left), ("expression", right)):
            side = union.args[key]
            cols = ", ".join(f"`{n}`" if n in have else f"null as `{n}`" for n in order)
            union.set(key, sqlglot.parse_one(
                f"select {cols} from ({_spark(side)}) as __by_name", read="spark"))
        union.set("by_name", None)
    return tree


def _row_keys(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``arg_min(x, (a, b))`` / ``arg_max`` (and ``min_by`` / ``max_by``) by a row of keys:
    DuckDB compares the rows field by field with a NULL field above every value; Spark
    compares structs with a NULL field below. Spark: the key
    ``struct(a is null, a, b is null, b)``, whose order is DuckDB's."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.ArgMin | exp.ArgMax) and isinstance(node.expression, exp.Tuple):
            fields: list[exp.Expr] = []
            for i, e in enumerate(node.expression.expressions):
                fields.append(exp.alias_(exp.Is(this=exp.Paren(this=e.copy()), expression=exp.Null()),
                                         f"n{i}"))
                fields.append(exp.alias_(e.copy(), f"v{i}"))
            node.set("expression", exp.Struct(expressions=fields))
        return node

    return tree.transform(swap)


def _any_value(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``any_value(x)``: DuckDB's skips NULLs. Spark: ``any_value(x, true)`` (its
    ``IGNORE NULLS`` form does not parse before a ``FILTER`` clause)."""

    def swap(node: exp.Expr) -> exp.Expr:
        inner = node.this if isinstance(node, exp.IgnoreNulls) else node
        if isinstance(inner, exp.AnyValue) and (isinstance(node, exp.IgnoreNulls)
                                               or not isinstance(node.parent, exp.IgnoreNulls)):
            return exp.Anonymous(this="any_value",
                                 expressions=[inner.this.copy(), exp.true()])
        return node

    return tree.transform(swap)


def _unnest_struct(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``unnest(<struct>)`` in a select list spreads the struct's fields into columns (here
    ``unnest(arg_min({...}, key))``, a struct visibly built with ``{...}``). Spark's
    ``explode`` takes only arrays and maps; ``inline(array(<struct>))`` gives the fields as
    columns, one row."""

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Explode | exp.Unnest):
            arg = node.this if isinstance(node, exp.Explode) else (
                node.expressions[0] if len(node.expressions) == 1 else None)
            if isinstance(arg, exp.ArgMin | exp.ArgMax) and isinstance(arg.this, exp.Struct) \
                    or isinstance(arg, exp.Struct):
                return exp.Anonymous(this="inline", expressions=[
                    exp.Array(expressions=[arg.copy()])])
        return node

    return tree.transform(swap)


_CONVERSION: Final = re.compile(r"%[-#0 +']*(?:\d+|\*)?(?:\.\d+)?([a-zA-Z%])")


def _string_literal(node: exp.Expr) -> str | None:
    """A string literal's text, or a concatenation of such (``'a' || 'b'``)."""
    if isinstance(node, exp.Literal) and node.is_string:
        return str(node.this)
    if isinstance(node, exp.DPipe):
        a, b = _string_literal(node.this), _string_literal(node.expression)
        return None if a is None or b is None else a + b
    if isinstance(node, exp.Paren):
        return _string_literal(node.this)
    return None


def _printf_floats(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``printf(fmt, ...)``: an argument of a ``%f``, ``%e`` or ``%g`` conversion is a double
    in DuckDB (its ``/`` always gives one); in Spark a division by a literal such as
    ``1000.0`` is a decimal, which ``%f`` refuses. Spark: those arguments cast to double (a
    format written as a concatenation of literals is read as their text). DuckDB rounds a
    ``%.Nf`` half to even, Java's formatter half up: the argument of a ``%.Nf`` is first
    ``bround(x, N)`` (half to even), so a tie (``2.5`` under ``%.0f``) prints as in DuckDB. A
    value whose decimal form ends in 5 at digit N+1 but whose double lies just below or above it
    (``2.675``) may still print one unit apart at N >= 1: DuckDB rounds the exact binary value,
    Spark its shortest decimal form."""

    def swap(node: exp.Expr) -> exp.Expr:
        if not (isinstance(node, exp.Anonymous) and node.name.lower() == "printf"):
            return node
        args = node.expressions
        fmt = _string_literal(args[0]) if args else None
        if fmt is None:
            return node
        args[0].replace(exp.Literal.string(fmt))
        args = node.expressions
        found = [m for m in _CONVERSION.finditer(fmt) if m.group(1) != "%"]
        for m, arg in zip(found, args[1:], strict=False):
            if m.group(1).lower() in ("f", "e", "g"):
                value: exp.Expr = exp.cast(arg.copy(), "double")
                digits = re.search(r"\.(\d+)", m.group(0))
                if m.group(1) == "f":
                    value = exp.Anonymous(this="bround", expressions=[
                        value, exp.Literal.number(int(digits.group(1)) if digits else 6)])
                arg.replace(value)
        return node

    return tree.transform(swap)


def _json_patch_pairs(node: exp.Expr) -> list[tuple[str, exp.Expr]] | None:
    """For ``json_merge_patch('{}', json_object(k, if(list_contains(keys, k), null, v), ...))``,
    every ``if`` testing the same ``keys``: [(k, the whole ``if``), ...]; None for any other
    expression."""
    if not (isinstance(node, exp.Anonymous) and node.name.lower() == "json_merge_patch"
            and len(node.expressions) == 2 and _string_literal(node.expressions[0]) == "{}"
            and isinstance(node.expressions[1], exp.JSONObject)):
        return None
    keys: exp.Expr | None = None
    pairs: list[tuple[str, exp.Expr]] = []
    for pair in node.expressions[1].expressions:
        key = _string_literal(pair.this) if isinstance(pair, exp.JSONKeyValue) else None
        value = pair.expression if isinstance(pair, exp.JSONKeyValue) else None
        if key is None or not (isinstance(value, exp.If) and isinstance(value.args.get("true"), exp.Null)
                               and isinstance(value.this, exp.ArrayContains)
                               and _string_literal(value.this.expression) == key):
            return None
        if keys is None:
            keys = value.this.this
        elif value.this.this != keys:
            return None
        pairs.append((key, value))
    return pairs or None


def _json_objects(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """``json_merge_patch(s, json_merge_patch('{}', json_object(k1, if(list_contains(keys, k1),
    null, v1), ...)))``, where ``keys`` holds the keys of the JSON object ``s`` (its
    ``json_keys``): ``s`` with each ``ki`` it lacks set to ``vi`` where ``vi`` is not NULL. Spark
    has neither function. As every added key is one ``s`` lacks, the two objects share no key and
    the patch is their union: Spark writes the added pairs with ``to_json(named_struct(...))``
    (which leaves out NULL fields, as the inner patch drops NULL members) and joins the two texts
    (``s`` as stored, the added pairs after it). Only that form is translated; another merge
    would need a key-by-key patch Spark cannot write. The texts differ from DuckDB's in
    formatting (spaces, key order, number forms), not in the object they parse to."""

    def swap(node: exp.Expr) -> exp.Expr:
        if not (isinstance(node, exp.Anonymous) and node.name.lower() == "json_merge_patch"
                and len(node.expressions) == 2):
            return node
        pairs = _json_patch_pairs(node.expressions[1])
        if pairs is None:
            if _string_literal(node.expressions[0]) != "{}":
                raise ValueError("json_merge_patch is translated only as the union of an object "
                                 "and the pairs of keys it lacks")
            return node
        stored = _spark(node.expressions[0])
        fields = ", ".join(f"'{k}', {_spark(v)}" for k, v in pairs)
        added = f"to_json(named_struct({fields}))"
        text = f"rtrim({stored})"
        return sqlglot.parse_one(
            f"case when {added} = '{{}}' then {stored} "
            f"when coalesce(size(json_object_keys({stored})), 0) = 0 then {added} "
            f"else concat(substr({text}, 1, length({text}) - 1), ',', substr({added}, 2)) end",
            read="spark")

    return tree.transform(swap)


def _parallel_unnests(tree: exp.Expr, settings: Mapping[str, str]) -> exp.Expr:
    """Several ``unnest(list)`` in one select list: DuckDB unnests them side by side (the i-th
    elements in one row, the shorter lists padded with NULL); Spark's several ``explode``
    would give every combination. Spark: one ``inline(arrays_zip(l1, l2, ...)) as (c1, c2,
    ...)``, side by side and padded the same way."""
    for select in tree.find_all(exp.Select):
        found = [(i, p) for i, p in enumerate(select.expressions)
                 if isinstance(p, exp.Alias) and isinstance(p.this, exp.Explode)]
        if len(found) < 2:
            continue
        zipped = exp.Aliases(this=exp.Inline(this=exp.ArraysZip(
            expressions=[p.this.this.copy() for _, p in found])),
            expressions=[exp.to_identifier(p.alias) for _, p in found])
        first = found[0][0]
        drop = {i for i, _ in found}
        items = [p for i, p in enumerate(select.expressions) if i not in drop]
        items.insert(first, zipped)
        select.set("expressions", items)
    return tree


REWRITES: Final[dict[str, Rewrite]] = {
    "session_variables": _session_variables,
    "md5_number": _md5_number,
    "folded_keys": _folded_keys,
    "folded_range_joins": _folded_range_joins,
    "hashes": _hashes,
    "hugeint": _hugeint,
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
    "asof_joins": _asof_joins,
    "union_by_name": _union_by_name,
    "row_keys": _row_keys,
    "any_value": _any_value,
    "unnest_struct": _unnest_struct,
    "printf_floats": _printf_floats,
    "parallel_unnests": _parallel_unnests,
    "json_objects": _json_objects,
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
class Stage:
    """A CTE the relation reads more than once (the ``shared_ctes`` step): the runner builds
    ``sql`` and keeps its rows as the view ``view`` before the relation's query, which reads
    that view where it named the CTE. Spark inlines a CTE at each reference, so a CTE read by
    several others was planned and computed once per path to it (a relation of about thirty
    CTEs became a plan of hundreds of shuffles, most of its time spent planning); DuckDB
    computes such a CTE once. A CTE written ``as not materialized`` stays inline."""

    view: str
    sql: str


@dataclass(frozen=True)
class Translation:
    """A relation in Spark SQL: its steps (recursions, shared CTEs) to evaluate first, in
    order, then its query."""

    steps: tuple[Recursion | Stage, ...]
    sql: str

    @property
    def recursions(self) -> tuple[Recursion, ...]:
        return tuple(s for s in self.steps if isinstance(s, Recursion))


def _spark(tree: exp.Expr) -> str:
    return tree.sql(dialect="spark", unsupported_level=sqlglot.ErrorLevel.RAISE)


def _with_ctes(query: exp.Expr, ctes: list[exp.CTE]) -> exp.Expr:
    """``query`` preceded by copies of ``ctes`` (before any CTE of its own)."""
    if not ctes:
        return query
    own = query.args.get("with_")
    listed = [c.copy() for c in ctes] + (list(own.expressions) if isinstance(own, exp.With) else [])
    query.set("with_", exp.With(expressions=listed))
    return query


def _scan_only(query: exp.Expr) -> bool:
    """Whether ``query`` only filters and projects one table's rows: read again at each
    reference for less than a job of its own costs."""
    from_ = query.args.get("from_") if isinstance(query, exp.Select) else None
    return isinstance(from_, exp.From) and isinstance(from_.this, exp.Table) \
        and not any(query.args.get(k) for k in ("joins", "group", "distinct", "with_", "qualify")) \
        and not any(isinstance(n, exp.Window | exp.AggFunc | exp.Subquery | exp.Explode
                                | exp.Unnest) for n in query.find_all(exp.Expr))


def _cte_steps(tree: exp.Expr, name: str, inline: frozenset[str]) -> tuple[exp.Expr,
                                                                           list[Recursion | Stage]]:
    """The top-level CTEs evaluated as steps of their own: each recursive one level by level
    (``recursive_cte_levels``), and each non-recursive one referenced more than once, unless
    in ``inline``, built once (``shared_ctes``). The other CTEs stay in the query, and are
    prefixed to each step that may read them."""
    with_ = tree.args.get("with_")
    if not isinstance(with_, exp.With):
        return tree, []
    steps: list[Recursion | Stage] = []
    kept: list[exp.CTE] = []
    ctes = list(with_.expressions)
    for i, cte in enumerate(ctes):
        body = cte.this
        own = cte.alias_or_name
        view = f"__{name}__{own}"
        if with_.args.get("recursive") and isinstance(body, exp.Union) and any(
                t.name == own and not t.db for t in body.expression.find_all(exp.Table)):
            if body.args.get("distinct"):
                raise ValueError(f"{name}: recursive CTE {own} is a union, not a union all")
            anchor = _with_ctes(body.this.copy(), kept)
            step = body.expression.copy()
            for table in list(step.find_all(exp.Table)):
                if table.name == own and not table.db:
                    table.replace(exp.to_table(f"{view}_prev").as_(table.alias or own))
            step = _with_ctes(step, kept)
            steps.append(Recursion(view, _spark(anchor), _spark(step)))
            cte.set("this", sqlglot.parse_one(f"select * from {view}_all", read="duckdb"))
            kept.append(cte)
            continue
        inside = {id(t) for c in ctes[:i + 1] for t in c.this.find_all(exp.Table)}
        readers = [t for t in tree.find_all(exp.Table)
                   if t.name == own and not t.db and id(t) not in inside]
        if len(readers) < 2 or own in inline or _scan_only(body):
            kept.append(cte)
            continue
        steps.append(Stage(view, _spark(_with_ctes(body.copy(), kept))))
        for table in readers:
            table.replace(exp.to_table(view).as_(table.alias or own))
    if kept:
        with_.set("expressions", kept)
        with_.set("recursive", None)
    else:
        tree.set("with_", None)
    return tree, steps


def translate(sql: str, name: str = "relation",
              settings: Mapping[str, str] | None = None, *, stages: bool = True) -> Translation:
    """One relation's ``select`` in Spark SQL (``name``: the relation's, for the names of the
    views its steps use; ``stages=False``: shared CTEs stay inline, one query)."""
    tree = sqlglot.parse_one(sql.strip().rstrip(";"), read="duckdb")
    with_ = tree.args.get("with_")
    inline = frozenset(c.alias_or_name for c in (with_.expressions if with_ else [])
                       if c.args.get("materialized") is False or not stages)
    for rewrite in REWRITES.values():
        tree = rewrite(tree, settings or {})
    tree, steps = _cte_steps(tree, name, inline)
    return Translation(tuple(steps), _spark(tree))


def to_spark(sql: str, settings: Mapping[str, str] | None = None) -> str:
    """One relation's ``select`` in Spark SQL, for a relation without recursive CTEs."""
    translation = translate(sql, settings=settings, stages=False)
    if translation.steps:
        raise ValueError("the relation has recursive CTEs: use translate()")
    return translation.sql
