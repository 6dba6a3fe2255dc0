"""Clock bounds with cancelled requests (docs/clock.md, int_clock_bounds_per_domain_pair).

A client that cancels ends its span while the router's forward span (and the replica) carry on:
the forward outlives its remote parent, so the pair's END bound is wrong. Such spans keep their
start bound only; before, the pair of domains came out inconsistent and every request through
the router was flagged clock_suspect.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from relation_rows import MS, T0, RawRows, one_request, query

import semconv
from audit._store import Store

SKEW_MS = 5_000


def _client_span(rows: RawRows, n: int) -> dict:
    (span,) = [s for s in rows.spans if s["span_id"] == f"{n:x}c".rjust(16, "0")]
    return span


def _cancel_early(rows: RawRows, n: int, *, status: str | None = "cancelled",
                  otel_status: str | None = None) -> None:
    """Client span of request n ends 300 ms after its start (the router's forward runs to 995)."""
    span = _client_span(rows, n)
    span["end_ns"] = span["start_ns"] + 300 * MS
    attrs = json.loads(span["attributes"])
    if status is not None:
        attrs[semconv.STATUS] = status
        span["a_status"] = status
    span["attributes"] = json.dumps(attrs)
    if otel_status is not None:
        span["status_code"] = otel_status


def _rows(cancelled: int = 1, **kw: object) -> RawRows:
    rows = RawRows()
    for n in range(1, 5):
        one_request(rows, n=n, base_ns=T0 + n * 2000 * MS, router_skew_ns=SKEW_MS * MS,
                    client_status="cancelled" if n == cancelled else "ok")
    _cancel_early(rows, cancelled, **kw)  # type: ignore[arg-type]
    return rows


def _router_offset(store: Store) -> dict:
    return query(
        store,
        "select clock_status, offset_ns from int_clock_offsets where clock_domain = 'router-host'",
    ).row(0, named=True)


def _pair(store: Store) -> dict:
    return query(
        store,
        "select * from int_clock_bounds_per_domain_pair "
        "where 'router-host' in (domain_a, domain_b) and 'client-host' in (domain_a, domain_b)",
    ).row(0, named=True)


@pytest.mark.parametrize("kw", [
    {"status": "cancelled"},
    {"status": "timeout"},
    {"status": None, "otel_status": "error"},
], ids=["cancelled", "timeout", "span_error"])
def test_abnormal_client_end_does_not_break_bounds(
    make_store: Callable[..., Store], kw: dict
) -> None:
    store = make_store(_rows(**kw))
    pair = _pair(store)
    assert pair["is_consistent"] is True
    router = _router_offset(store)
    assert router["clock_status"] == "bounded"
    assert router["offset_ns"] == pytest.approx(SKEW_MS * MS, abs=10 * MS)
    flagged = query(store, "select count(*) filter (where clock_suspect) as n from requests")
    assert flagged.item() == 0


def test_the_same_early_end_with_status_ok_is_still_inconsistent(
    make_store: Callable[..., Store],
) -> None:
    """Control: a callee outliving a caller that ended normally is still a clock problem."""
    rows = _rows(status="ok")
    store = make_store(rows)
    assert _pair(store)["is_consistent"] is False
    assert _router_offset(store)["clock_status"] == "inconsistent"


def test_cancelled_pair_keeps_its_start_bound(make_store: Callable[..., Store]) -> None:
    """A store whose only cross-domain pairs come from a cancelled request: the start bound
    alone (a half-bound) gives the estimate and no inconsistency."""
    rows = RawRows()
    one_request(rows, n=1, base_ns=T0, router_skew_ns=SKEW_MS * MS, client_status="cancelled")
    _cancel_early(rows, 1)
    store = make_store(rows)
    got = query(
        store,
        "select * from int_clock_bounds_per_domain_pair where pair_count > 0 order by domain_a",
    )
    by_pair = {(r["domain_a"], r["domain_b"]): r for r in got.iter_rows(named=True)}
    cr = by_pair[("client-host", "router-host")]
    assert cr["is_consistent"] is True
    # d(client - router) >= client_start - router_start = -(SKEW + 5 ms) is the only bound
    # left from the decision span (the forward's end bound is dropped)
    assert cr["upper_ns"] is None
    assert cr["lower_ns"] == -(SKEW_MS + 5) * MS
    assert cr["offset_a_minus_b_ns"] == cr["lower_ns"]
    # the router -> replica pair is normal: both bounds
    rr = by_pair[("replica-host", "router-host")]
    assert rr["lower_ns"] is not None and rr["upper_ns"] is not None and rr["is_consistent"]
