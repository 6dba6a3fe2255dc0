"""int_attr_idle_prefills against the overlap rule itself, over random prefills.

The relation finds the prefills that overlapped another on their replica in one pass over each
replica's prefills in start order; here the rule is applied to every pair: an idle-started
execution's prefill was shared iff another execution on the same replica, with both instants,
started before its first token and had its first token after its start. Equal starts, nested
prefills, prefills that only touch, executions without a first token and replicas with one
prefill are all drawn.
"""

from __future__ import annotations

import datetime as dt
import random

import duckdb
import pytest

from audit import _relations

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _sql() -> str:
    return next(r.sql for r in _relations.load_relations() if r.name == "int_attr_idle_prefills")


def _executions(rng: random.Random, n: int) -> list[tuple[str, str, str, dt.datetime | None,
                                                           dt.datetime | None]]:
    rows = []
    for i in range(n):
        replica = rng.choice(["a", "b", "c", "d"]) if i else "lonely"
        start = rng.randrange(0, 40 * n)  # coarse ms: equal starts and touching ends happen
        first = start + rng.randrange(1, 60)
        rows.append((f"req-{i}", f"span-{i}", replica, T0 + dt.timedelta(milliseconds=start),
                     None if rng.random() < 0.05 else T0 + dt.timedelta(milliseconds=first)))
    return rows


def _shared(e: tuple, rows: list[tuple]) -> bool:
    _, _, replica, start, first = e
    if start is None or first is None:
        return False
    return any(o is not e and o[2] == replica and o[3] is not None and o[4] is not None
               and o[3] < first and o[4] > start for o in rows)


@pytest.mark.parametrize("seed", range(5))
def test_idle_prefills_are_those_no_other_prefill_overlapped(seed: int) -> None:
    rng = random.Random(seed)
    rows = _executions(rng, 400)
    idle = [r for r in rows if rng.random() < 0.5]
    con = duckdb.connect()
    try:
        con.execute("create table int_attr_executions_timed (request_key varchar, span_id varchar, "
                    "replica varchar, prefill_start_at timestamptz, first_token_at timestamptz)")
        con.executemany("insert into int_attr_executions_timed values (?, ?, ?, ?, ?)", rows)
        con.execute("create table int_attr_candidates_state (request_key varchar, "
                    "exec_span_id varchar, chosen boolean, replica varchar, exec_replica varchar, "
                    "drain_ms double)")
        # one chosen, idle candidate row per idle start (two for some: a decision retried),
        # and rows the relation must ignore: not chosen, another replica, a drain to wait for
        cands = [(k, s, True, r, r, 0.0) for k, s, r, *_ in idle]
        cands += [(k, s, True, r, r, 0.0) for k, s, r, *_ in idle[:20]]
        cands += [(k, s, False, "x", r, 0.0) for k, s, r, *_ in rows[:50]]
        cands += [(k, s, True, r, r, 5.0) for k, s, r, *_ in rows[50:100]]
        con.executemany("insert into int_attr_candidates_state values (?, ?, ?, ?, ?, ?)", cands)
        got = sorted(con.execute(_sql()).fetchall())
    finally:
        con.close()
    want = sorted((e[0], e[1]) for e in idle if not _shared(e, rows))
    assert got == want
    # the draw has both kinds, and prefills that overlapped
    assert 0 < len(want) < len(idle)
