"""What-if replay (``routeaudit whatif``): recorded arrivals replayed in virtual time.

The arrivals of a window of a store (arrival instant, input and output tokens, prefix hashes) are
replayed through the testbed's fleet simulator twice: under the policy the store recorded (the
check: how close the calibrated model comes to what happened) and under the policy asked for,
optionally with another replica count or telemetry interval. The replica model is calibrated from
the store's own executions (docs/whatif.md, "Calibration"). Both simulated runs go through the
same OpenTelemetry → OTLP/HTTP → collector path as ``routeaudit demo`` into a second store, so
``routeaudit compare`` and the dashboard's Policies page read them like any run.

It reads the store through ``audit`` and simulates with ``testbed``; the audit never imports the
testbed.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from audit import SLO, Reader
    from testbed import CostModel, FleetConfig, Request, Simulation

__all__ = [
    "Calibration",
    "Figures",
    "Recorded",
    "RecordedRequest",
    "WhatIfError",
    "WhatIfResult",
    "calibrate",
    "figures_of_recorded",
    "figures_of_simulation",
    "fleet_config",
    "format_whatif",
    "load_recorded",
    "outside_engine_ms",
    "run_whatif",
    "to_requests",
]

DEFAULT_MAX_TOKENS = 2048
"""Output cap given to a recorded request whose ``max_tokens`` the store does not hold."""
SPEED_SNAP = 0.1
"""A replica whose measured prefill speed is within this share of the fleet median is read as
nominal: prefill times under different load differ by that much on identical replicas."""
MIN_FIT_POINTS = 5
"""Fewest executions a fit uses; below that the testbed's default for the term is kept."""
_MASK = (1 << 63) - 1


class WhatIfError(Exception):
    """A what-if request that cannot be answered as asked (bad window, unknown policy, a store
    without the columns a replay needs). The message is one line for the user."""


# ------------------------------------------------------------------------------------------
# what the store recorded
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedRequest:
    """One recorded request as the replay needs it, plus how it went."""

    request_key: str
    request_id: str
    arrival_ns: int
    input_tokens: int
    output_tokens: int | None
    max_tokens: int | None
    prefix_hashes: tuple[str, ...]
    status: str
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    engine_ttft_ms: float | None = None


@dataclass(frozen=True)
class Recorded:
    """A window of a store: its requests and the fleet settings read from its spans."""

    description: str
    run_ids: tuple[str | None, ...]
    requests: tuple[RecordedRequest, ...]
    dropped: int
    policy: str | None
    replicas: tuple[str, ...]
    n_routers: int
    telemetry_interval_s: float | None
    pending_correction: bool | None
    admission_limit: int | None
    client_timeout_s: float | None
    block_tokens: int | None

    @property
    def t0_ns(self) -> int:
        return self.requests[0].arrival_ns


_REQUESTS_SQL = """
with
selected as (
    select
        request_key,
        request_id,
        run_id,
        policy,
        epoch_ns(coalesce(client_start, first_seen_at)) as arrival_ns,
        input_tokens,
        output_tokens,
        max_tokens,
        coalesce(status, 'ok') as status,
        coalesce(ttft_ms, e2e_ms) as ttft_ms,
        replica_ttft_ms,
        tpot_ms,
        e2e_ms
    from requests
    where ({run_filter})
        and coalesce(client_start, first_seen_at) >= coalesce(cast(? as timestamptz),
            coalesce(client_start, first_seen_at))
        and coalesce(client_start, first_seen_at) < coalesce(cast(? as timestamptz),
            coalesce(client_start, first_seen_at) + interval 1 second)
),

decision_hashes as (
    select
        d.request_key,
        first(s.a_prefix_hashes order by d.attempt) as prefix_hashes
    from decisions as d
    inner join selected as q
        on d.request_key = q.request_key
    inner join raw_spans as s
        on d.trace_id = s.trace_id
        and d.span_id = s.span_id
    where len(s.a_prefix_hashes) > 0
    group by d.request_key
),

final as (
    select
        q.*,
        h.prefix_hashes
    from selected as q
    left join decision_hashes as h
        on q.request_key = h.request_key
    order by q.arrival_ns, q.request_key
)

select * from final
"""

_FLEET_SQL = """
with
selected as (
    select request_key from requests
    where request_key in (select unnest(?::varchar[]))
),

window_decisions as (
    select d.* from decisions as d inner join selected as q on d.request_key = q.request_key
),

window_candidates as (
    select c.* from candidates as c inner join selected as q on c.request_key = q.request_key
)

select
    (select count(distinct router_id) from window_decisions) as n_routers,
    (select max(pending) from window_candidates) as max_pending,
    (select count(*) from window_candidates) as n_candidates,
    (select min(coalesce(waiting, 0) + coalesce(pending, 0)) from window_candidates
        where excluded_reason = 'full') as full_at,
    (select list(distinct replica) from window_candidates where replica is not null)
        as candidate_replicas
"""

_TELEMETRY_SQL = """
with
ages as (
    -- one reading per (router, decision instant, replica): a burst of decisions at one
    -- instant all see the same snapshots
    select distinct c.router_id, c.decided_at, c.replica, c.telemetry_age_ms
    from candidates as c
    where c.request_key in (select unnest(?::varchar[])) and c.telemetry_age_ms >= 0
)

select quantile_cont(telemetry_age_ms, 0.99) as age_p99_ms, count(*) as n from ages
"""

_EXECUTIONS_SQL = """
select
    e.request_key,
    e.replica,
    epoch_ns(e.start_at) as start_ns,
    e.queue_ms,
    e.prefill_ms,
    e.decode_ms,
    e.e2e_ms,
    e.input_tokens,
    e.output_tokens,
    coalesce(e.cached_tokens, 0) as cached_tokens,
    coalesce(e.preemptions, 0) as preemptions
from executions as e
where e.request_key in (select unnest(?::varchar[])) and e.replica is not null
"""

_KV_USAGE_SQL = """
with
seen as (
    select c.replica, epoch_ns(c.telemetry_ts) as ts, c.kv_usage
    from candidates as c
    where c.request_key in (select unnest(?::varchar[]))
        and c.telemetry_ts is not null and c.kv_usage is not null
),

scraped as (
    select s.replica, s.scraped_ns as ts, s.kv_usage
    from snapshots as s
    where s.ok and s.kv_usage is not null and s.scraped_ns between ? and ?
)

select distinct replica, ts, kv_usage from (select * from seen union all select * from scraped)
where kv_usage >= ?
"""

_NEEDED = {
    "requests": ("request_key", "request_id", "run_id", "policy", "client_start", "first_seen_at",
                 "input_tokens", "output_tokens", "max_tokens", "status", "ttft_ms", "tpot_ms",
                 "e2e_ms", "replica_ttft_ms"),
    "executions": ("request_key", "replica", "start_at", "queue_ms", "prefill_ms", "decode_ms",
                   "e2e_ms", "input_tokens", "output_tokens", "cached_tokens", "preemptions"),
}


def _parse_time(text: str | None, flag: str) -> str | None:
    if text is None:
        return None
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise WhatIfError(f"{flag} wants an ISO time such as 2026-01-01T00:00:00Z, "
                          f"got {text!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.isoformat()


def _check_columns(reader: Reader) -> None:
    relations = set(reader.relations())
    for relation, columns in _NEEDED.items():
        if relation not in relations:
            raise WhatIfError(f"the store has no {relation!r} relation (is it a routeaudit store?)")
        have = set(reader.query(f"select * from {relation} limit 0").columns)
        missing = [c for c in columns if c not in have]
        if missing:
            raise WhatIfError(f"the store's {relation!r} lacks {', '.join(missing)} "
                              "(written by an older routeaudit?)")


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _block_tokens(reqs: Sequence[RecordedRequest]) -> int | None:
    """The prompt tokens per prefix hash: ``ceil(input / B) == len(hashes)`` for every request
    holds B in ``[input / n, input / (n - 1))``; the widest power of two in the intersection
    (trace formats use 16, 64, 512), else its lower end."""
    lo, hi = 1.0, math.inf
    for r in reqs:
        n = len(r.prefix_hashes)
        if n == 0 or r.input_tokens <= 0:
            continue
        lo = max(lo, r.input_tokens / n)
        if n > 1:
            hi = min(hi, r.input_tokens / (n - 1))
    if lo == 1.0 and hi == math.inf:
        return None
    b_lo = math.ceil(lo)
    if hi != math.inf and b_lo >= hi:
        # inconsistent (hashes of mixed block sizes): the lower end still bounds the segment
        return b_lo
    power = 1 << max(0, math.ceil(math.log2(b_lo)))
    return power if hi == math.inf or power < hi else b_lo


def _poll_interval(oldest_s: float) -> float:
    """The telemetry interval from the oldest telemetry decisions saw (their 99th percentile):
    a poll is at most one interval old, so the interval is just above it; configured intervals
    are round (1, 2, 2.5 or 5 times a power of ten), so the next round value within 10 % is
    taken, else the figure itself."""
    exponent = math.floor(math.log10(oldest_s))
    for power in (exponent - 1, exponent, exponent + 1):
        for mantissa in (1.0, 2.0, 2.5, 5.0):
            value = mantissa * 10.0 ** power
            if oldest_s * 0.98 <= value <= oldest_s * 1.1:
                return round(value, 6)
    return round(oldest_s, 6)


def load_recorded(reader: Reader, *, run: str | None = None, since: str | None = None,
                  until: str | None = None) -> Recorded:
    """The requests of one window of ``reader`` (``run`` and/or ``[since, until)``, ISO times)
    and the fleet settings their spans show. Raises :class:`WhatIfError` on an empty window, a
    window holding several runs (unless one is named) or a store without the needed columns."""
    _check_columns(reader)
    since_iso, until_iso = _parse_time(since, "--since"), _parse_time(until, "--until")
    run_filter = "run_id = ?" if run is not None else "true"
    params: list[Any] = ([run] if run is not None else []) + [since_iso, until_iso]
    frame = reader.query(_REQUESTS_SQL.format(run_filter=run_filter), params)
    where = " ".join(x for x in (f"of run {run!r}" if run else "",
                                 f"from {since}" if since else "",
                                 f"until {until}" if until else "") if x) or "in the store"
    if frame.height == 0:
        runs = reader.query("select distinct run_id from requests order by 1")["run_id"].to_list()
        raise WhatIfError(f"no requests {where} (runs in the store: "
                          f"{', '.join(str(r) for r in runs[:10]) or 'none'})")
    runs_seen = sorted({r for r in frame["run_id"].to_list()}, key=lambda r: (r is None, r or ""))
    if run is None and len(runs_seen) > 1:
        # two runs replaying one trace overlap in time: mixing them doubles the load
        raise WhatIfError(f"the window holds {len(runs_seen)} runs ({', '.join(map(str, runs_seen[:6]))}"
                          f"{', …' if len(runs_seen) > 6 else ''}): pick one with --run")
    reqs: list[RecordedRequest] = []
    dropped = 0
    for row in frame.iter_rows(named=True):
        if row["input_tokens"] is None or row["arrival_ns"] is None:
            dropped += 1
            continue
        reqs.append(RecordedRequest(
            request_key=str(row["request_key"]),
            request_id=str(row["request_id"] or row["request_key"]), arrival_ns=int(row["arrival_ns"]),
            input_tokens=max(1, int(row["input_tokens"])), output_tokens=row["output_tokens"],
            max_tokens=row["max_tokens"], prefix_hashes=tuple(row["prefix_hashes"] or ()),
            status=str(row["status"]), ttft_ms=row["ttft_ms"], tpot_ms=row["tpot_ms"],
            e2e_ms=row["e2e_ms"], engine_ttft_ms=row["replica_ttft_ms"]))
    # Arrivals at one instant keep the order their ids give (a trace's line order), not the
    # random order of their span ids: round-robin-like policies depend on it.
    reqs.sort(key=lambda r: (r.arrival_ns, _natural(r.request_id)))
    if not reqs:
        raise WhatIfError(f"none of the {frame.height} requests {where} has an input token count "
                          "and an arrival time: nothing to replay")
    policies = [p for p in frame["policy"].to_list() if p]
    policy = statistics.mode(policies) if policies else None
    keys = frame["request_key"].to_list()
    fleet = reader.query(_FLEET_SQL, [keys]).row(0, named=True)
    tele = reader.query(_TELEMETRY_SQL, [keys]).row(0, named=True)
    served = reader.query("select distinct replica from executions where request_key in "
                          "(select unnest(?::varchar[])) and replica is not null", [keys])
    replicas = set(served["replica"].to_list()) | set(fleet["candidate_replicas"] or ())
    timed_out = [r.e2e_ms for r in reqs if r.status in ("timeout", "cancelled") and r.e2e_ms]
    pending = None if not fleet["n_candidates"] else bool((fleet["max_pending"] or 0) > 0)
    full_at = fleet["full_at"]
    return Recorded(
        description=where,
        run_ids=tuple(runs_seen),
        requests=tuple(reqs),
        dropped=dropped,
        policy=policy,
        replicas=tuple(sorted(replicas, key=_natural)),
        n_routers=max(1, int(fleet["n_routers"] or 1)),
        telemetry_interval_s=(_poll_interval(tele["age_p99_ms"] / 1000.0)
                              if tele["age_p99_ms"] and (tele["n"] or 0) >= 20 else None),
        pending_correction=pending,
        admission_limit=None if full_at is None else max(1, int(full_at)),
        client_timeout_s=statistics.median(timed_out) / 1000.0 if timed_out else None,
        block_tokens=_block_tokens(reqs),
    )


# ------------------------------------------------------------------------------------------
# calibration
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """The replica model fitted to a window's executions.

    ``speeds``: recorded replica id → speed factor (1 = the fleet's median replica).
    ``sources``: for each cost-model term, where its value came from (``idle fit``,
    ``decode fit``, ``default``)."""

    cost: CostModel
    speeds: dict[str, float]
    kv_capacity_tokens: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    n_executions: int = 0

    def describe(self) -> str:
        c = self.cost
        slow = {r: s for r, s in self.speeds.items() if s != 1.0}
        speeds = (", ".join(f"{r} {s:.2f}" for r, s in slow.items()) + "; others 1.00"
                  if slow else "all 1.00")
        return (f"prefill {c.prefill_ms_per_token:.4f} ms/token + {c.prefill_attn_ms_per_token2:.2e} "
                f"ms/token² ({self.sources.get('prefill', 'default')}); step {c.step_overhead_ms:.2f} ms"
                f" + {c.decode_ms_per_seq:.3f} ms/seq + {c.decode_ms_per_ctx_token:.2e} ms/context "
                f"token ({self.sources.get('decode', 'default')}); KV pool "
                + (f"{self.kv_capacity_tokens:,} tokens (kv_usage fit)" if self.kv_capacity_tokens
                   else "the testbed's default") + f"; speeds: {speeds}; "
                f"from {self.n_executions} executions")


class _Sweep:
    """A step function of time (sum of weights of the open intervals) and its running
    integral, to read the time-average over any interval in O(log n)."""

    def __init__(self, intervals: Sequence[tuple[float, float, float]]) -> None:
        deltas: dict[float, float] = {}
        for start, end, weight in intervals:
            if end > start:
                deltas[start] = deltas.get(start, 0.0) + weight
                deltas[end] = deltas.get(end, 0.0) - weight
        self.times = sorted(deltas)
        self.level: list[float] = []
        self.area: list[float] = []
        level = area = 0.0
        prev = self.times[0] if self.times else 0.0
        for t in self.times:
            area += level * (t - prev)
            level += deltas[t]
            self.level.append(level)
            self.area.append(area)
            prev = t

    def at(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t) - 1
        return self.level[k] if k >= 0 else 0.0

    def integral(self, t: float) -> float:
        k = bisect.bisect_right(self.times, t) - 1
        if k < 0:
            return 0.0
        return self.area[k] + self.level[k] * (t - self.times[k])

    def mean(self, start: float, end: float) -> float:
        return (self.integral(end) - self.integral(start)) / (end - start) if end > start else 0.0


def _least_squares(xs: Sequence[Sequence[float]], ys: Sequence[float], *,
                   intercept: bool = True,
                   weights: Sequence[float] | None = None) -> list[float] | None:
    """(Weighted) least squares (normal equations, Gaussian elimination), the intercept first
    when asked for; None when the regressors are collinear."""
    if not xs:
        return None
    k = len(xs[0]) + (1 if intercept else 0)
    a = [[0.0] * k for _ in range(k)]
    b = [0.0] * k
    for n, (x, y) in enumerate(zip(xs, ys, strict=True)):
        row = [1.0, *x] if intercept else list(x)
        w = 1.0 if weights is None else weights[n]
        for i in range(k):
            b[i] += w * row[i] * y
            for j in range(k):
                a[i][j] += w * row[i] * row[j]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * max(1.0, abs(a[col][col])):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(k):
            if r != col:
                f = a[r][col] / a[col][col]
                for j in range(col, k):
                    a[r][j] -= f * a[col][j]
                b[r] -= f * b[col]
    return [b[i] / a[i][i] for i in range(k)]


@dataclass
class _Execution:
    request_key: str
    replica: str
    admit: float  # ms, reference clock
    first: float
    end: float
    uncached: int
    cached: int
    context: float
    output: int
    prefill_ms: float
    decode_ms: float | None
    preempted: bool = False
    decoding_in_prefill: float = 0.0
    context_in_prefill: float = 0.0
    decoding: float = 0.0
    context_decoding: float = 0.0
    solo: bool = False


def _executions(rows: Sequence[dict[str, Any]]) -> dict[str, list[_Execution]]:
    """Executions with their timing, grouped by replica, with the time-averaged load they
    shared their steps with: sequences decoding (and their context) during their prefill and
    during their decode, and whether their prefill overlapped another prefill."""
    by_replica: dict[str, list[_Execution]] = {}
    for r in rows:
        if None in (r["start_ns"], r["queue_ms"], r["prefill_ms"], r["e2e_ms"], r["input_tokens"]):
            continue
        admit = r["start_ns"] / 1e6 + r["queue_ms"]
        inp, out, cached = int(r["input_tokens"]), int(r["output_tokens"] or 0), int(r["cached_tokens"])
        by_replica.setdefault(r["replica"], []).append(_Execution(
            request_key=r["request_key"], replica=r["replica"], admit=admit, first=admit + r["prefill_ms"],
            end=r["start_ns"] / 1e6 + r["e2e_ms"], uncached=max(0, inp - cached), cached=cached,
            context=inp + out / 2, output=out, prefill_ms=r["prefill_ms"], decode_ms=r["decode_ms"],
            preempted=bool(r.get("preemptions"))))
    for group in by_replica.values():
        decoding = _Sweep([(e.first, e.end, 1.0) for e in group])
        context = _Sweep([(e.first, e.end, e.context) for e in group])
        prefilling = _Sweep([(e.admit, e.first, 1.0) for e in group])
        for e in group:
            e.decoding_in_prefill = decoding.mean(e.admit, e.first)
            e.context_in_prefill = context.mean(e.admit, e.first)
            e.decoding = decoding.mean(e.first, e.end)
            e.context_decoding = context.mean(e.first, e.end)
            # alone: the only prefill in flight on its replica for its whole prefill, and never
            # preempted (a recompute is work the timing does not show)
            e.solo = (not e.preempted and e.first > e.admit
                      and prefilling.mean(e.admit, e.first) < 1.0 + 1e-9)
    return by_replica


def _robust_fit(xs: Sequence[Sequence[float]], ys: Sequence[float], *,
                intercept: bool = True) -> list[float] | None:
    """Least absolute deviations (iteratively reweighted least squares): the fit through the
    median, not the mean, of the points at each load. A few executions pay costs the model
    does not have (a recompute after a preemption elsewhere, a prefill duty misread near
    saturation); their residuals are large and one-sided and would pull a least-squares fit."""
    fit = _least_squares(xs, ys, intercept=intercept)
    for _ in range(20):
        if fit is None:
            return None
        coef = fit
        res = [abs(y - ((coef[0] if intercept else 0.0)
                        + sum(c * v for c, v in zip(coef[1:] if intercept else coef, x,
                                                      strict=True))))
               for x, y in zip(xs, ys, strict=True)]
        scale = statistics.median(res) or 1.0
        weights = [1.0 / max(r, 1e-3 * scale) for r in res]
        new = _least_squares(xs, ys, intercept=intercept, weights=weights)
        if new is None:
            return fit
        if max(abs(u - v) for u, v in zip(new, fit, strict=True)) <= 1e-9 * max(
                1.0, *(abs(v) for v in fit)):
            return new
        fit = new
    return fit


def calibrate(reader: Reader, recorded: Recorded) -> Calibration:
    """Fit the testbed's cost model and per-replica speeds to the window's executions.

    The step-time model (docs/testbed.md) is fitted in three parts, repeated until they agree
    (each needs the others' current values):

    * speed: per replica, what its solo prefills (no other prefill in flight on the replica)
      would have cost at speed 1 under the current model, over what they took; the fleet's
      median replica is 1, and within :data:`SPEED_SNAP` of it a replica is read as nominal;
    * prefill: solo prefills, scaled to speed 1, minus their steps' overhead and the decodes
      that shared them: least squares on ``uncached`` and ``uncached · (cached + uncached/2)``
      (no intercept);
    * decode: per execution, decode ms per token × speed × (1 − the replica's prefill duty over
      its decode) = overhead + per_seq · sequences decoding + per_ctx · their context (the
      prefill duty removes the prefill chunks that shared its steps, which the simulator adds
      back itself).

    A term without :data:`MIN_FIT_POINTS` points keeps the testbed's default.
    """
    import testbed

    default = testbed.CostModel()
    mbt = testbed.ReplicaConfig().max_batched_tokens
    rows = list(reader.query(_EXECUTIONS_SQL, [[r.request_key for r in recorded.requests]])
                .iter_rows(named=True))
    by_replica = _executions(rows)
    sources: dict[str, str] = {}
    overhead, per_seq, per_ctx = (default.step_overhead_ms, default.decode_ms_per_seq,
                                  default.decode_ms_per_ctx_token)
    slope, attn = default.prefill_ms_per_token, default.prefill_attn_ms_per_token2
    speeds = {rep: 1.0 for rep in by_replica}

    def steps_ms(e: _Execution) -> float:
        steps = max(1, math.ceil(e.uncached / mbt))
        return steps * (overhead + per_seq * e.decoding_in_prefill + per_ctx * e.context_in_prefill)

    solo = [e for group in by_replica.values() for e in group if e.solo and e.uncached > 0]
    for _ in range(4):
        # ---- speeds
        raw: dict[str, float] = {}
        for rep, group in by_replica.items():
            pred = meas = 0.0
            for e in group:
                if e.solo and e.uncached > 0:
                    pred += (e.uncached * (slope + attn * (e.cached + e.uncached / 2))
                             + steps_ms(e))
                    meas += e.prefill_ms
            if meas > 0 and pred > 0:
                raw[rep] = pred / meas
        if raw:
            mid = statistics.median(raw.values())
            for rep, value in raw.items():
                speed = value / mid
                speeds[rep] = 1.0 if abs(speed - 1.0) <= SPEED_SNAP else round(speed, 3)
        # ---- prefill
        if len(solo) >= MIN_FIT_POINTS:
            xs = [[float(e.uncached), e.uncached * (e.cached + e.uncached / 2)] for e in solo]
            ys = [e.prefill_ms * speeds.get(e.replica, 1.0) - steps_ms(e) for e in solo]
            fit = _robust_fit(xs, ys, intercept=False)
            if fit is not None and fit[0] > 0 and fit[1] >= 0:
                slope, attn = fit
                sources["prefill"] = "solo-prefill fit"
            else:
                fit = _robust_fit([[x[0]] for x in xs], ys, intercept=False)
                if fit is not None and fit[0] > 0:
                    slope, attn = fit[0], 0.0
                    sources["prefill"] = "solo-prefill fit (linear)"
        # ---- decode
        xs, ys = [], []
        for rep, group in by_replica.items():
            speed = speeds.get(rep, 1.0)
            duty = _Sweep([(e.admit, e.first, min(1.0, e.uncached * (slope + attn * (
                e.cached + e.uncached / 2)) / speed / (e.first - e.admit)))
                for e in group if e.first > e.admit])
            for e in group:
                if e.output < 2 or e.decode_ms is None or e.end <= e.first or e.preempted:
                    continue
                rho = min(0.95, duty.mean(e.first, e.end))
                xs.append([e.decoding, e.context_decoding])
                ys.append(e.decode_ms / (e.output - 1) * speed * (1.0 - rho))
        if len(xs) >= MIN_FIT_POINTS:
            fit = _robust_fit(xs, ys)
            if fit is not None and fit[0] > 0 and fit[1] >= 0 and fit[2] >= 0:
                overhead, per_seq, per_ctx = fit
                sources["decode"] = "decode fit"
            else:
                fit = _robust_fit([[x[0]] for x in xs], ys)
                if fit is not None and fit[0] > 0 and fit[1] >= 0:
                    overhead, per_seq, per_ctx = fit[0], fit[1], 0.0
                    sources["decode"] = "decode fit (sequences only)"
    for rep in recorded.replicas:
        speeds.setdefault(rep, 1.0)
    kv_capacity = _kv_capacity(reader, recorded, by_replica, block_size=testbed.ReplicaConfig().block_size,
                               chunk_tokens=mbt)
    if kv_capacity is not None:
        sources["kv"] = "kv_usage fit"
    cost = dataclasses.replace(default, step_overhead_ms=overhead, decode_ms_per_seq=per_seq,
                               decode_ms_per_ctx_token=per_ctx, prefill_ms_per_token=slope,
                               prefill_attn_ms_per_token2=attn)
    return Calibration(cost=cost, speeds=speeds, kv_capacity_tokens=kv_capacity, sources=sources,
                       n_executions=len(rows))


KV_USAGE_MIN = 0.1
"""KV usage readings below this are too coarse to size the pool from."""


def _kv_capacity(reader: Reader, recorded: Recorded, by_replica: dict[str, list[_Execution]], *,
                 block_size: int, chunk_tokens: int, max_readings: int = 2000) -> int | None:
    """The KV pool per replica, in tokens: at each reading of a replica's KV usage (what its
    routers saw, or a scrape; at most ``max_readings``, evenly spaced), the blocks its admitted
    executions held over the usage; the median over readings, to 1,000 tokens. A request holds
    its prompt's blocks (a prefix segment shared by several requests in flight counts once, as
    in the engine's prefix cache) and the blocks of the output generated so far."""
    first = recorded.requests[0].arrival_ns
    last = recorded.requests[-1].arrival_ns + 3_600 * 10**9
    readings = reader.query(_KV_USAGE_SQL, [[r.request_key for r in recorded.requests], first,
                                            last, KV_USAGE_MIN])
    points = sorted((rep, ts / 1e6, usage) for rep, ts, usage in readings.iter_rows())
    if len(points) > max_readings:
        points = points[:: math.ceil(len(points) / max_readings)]
    segments: dict[str, list[tuple[int, int]]] = {}
    block = recorded.block_tokens or 512
    for r in recorded.requests:
        keys = [_key(h) for h in r.prefix_hashes]
        sizes = [min(block, r.input_tokens - i * block) for i in range(len(keys))]
        segments[r.request_key] = [(k, math.ceil(max(1, n) / block_size))
                                   for k, n in zip(keys, sizes, strict=True)]
    ordered = {rep: sorted(group, key=lambda e: e.admit) for rep, group in by_replica.items()}
    longest = {rep: max((e.end - e.admit for e in group), default=0.0)
               for rep, group in ordered.items()}
    admits = {rep: [e.admit for e in group] for rep, group in ordered.items()}
    ratios: list[float] = []
    for rep, t, usage in points:
        group = ordered.get(rep)
        if not group:
            continue
        hi = bisect.bisect_right(admits[rep], t)
        lo = bisect.bisect_left(admits[rep], t - longest[rep])
        shared: dict[int, int] = {}
        own = 0
        for e in group[lo:hi]:
            if e.end <= t:
                continue
            prompt = e.uncached + e.cached
            made = (e.output * (t - e.first) / (e.end - e.first)) if t > e.first < e.end else 0.0
            # a prefill allocates a chunk's blocks when the step computing it starts: with
            # chunks of the step budget spread evenly over the prefill
            steps = max(1, math.ceil(e.uncached / chunk_tokens))
            done = math.floor(steps * max(0.0, t - e.admit) / (e.first - e.admit)) + 1
            held = (prompt if t >= e.first else
                    e.cached + min(e.uncached, done * chunk_tokens))
            segs = segments.get(e.request_key)
            if segs:
                left = math.ceil(held / block_size)
                for k, n in segs:
                    if left <= 0:
                        break
                    shared[k] = max(shared.get(k, 0), min(n, left))
                    left -= n
                own += math.ceil((prompt + made) / block_size) - math.ceil(prompt / block_size)
            else:
                own += math.ceil((held + made) / block_size)
        held = (own + sum(shared.values())) * block_size
        if held > 0:
            ratios.append(held / usage)
    if len(ratios) < MIN_FIT_POINTS:
        return None
    tokens = statistics.median(ratios)
    return max(block_size, int(round(tokens / 1000.0)) * 1000)


# ------------------------------------------------------------------------------------------
# the simulated fleet
# ------------------------------------------------------------------------------------------
def to_requests(recorded: Recorded) -> list[Request]:
    """The recorded arrivals as testbed requests, in virtual seconds from the first arrival.

    The output length a request would have produced is the recorded one when it finished; for a
    request cut short (timeout, cancelled, rejected, failed) it is unknown, so it gets the
    window's median finished length (at most its cap). Without prefix hashes a prompt gets keys
    of its own: it can only be cached by itself."""
    from testbed import Request

    finished = [r.output_tokens for r in recorded.requests
                if r.status == "ok" and r.output_tokens is not None]
    typical = max(1, int(statistics.median(finished))) if finished else 256
    block = recorded.block_tokens or 512
    t0 = recorded.t0_ns
    out: list[Request] = []
    for i, r in enumerate(recorded.requests):
        cap = r.max_tokens if r.max_tokens and r.max_tokens > 0 else max(
            DEFAULT_MAX_TOKENS, r.output_tokens or 0)
        produced = r.output_tokens if r.status == "ok" and r.output_tokens else min(
            cap, max(typical, r.output_tokens or 0))
        n_blocks = max(1, math.ceil(r.input_tokens / block))
        if r.prefix_hashes:
            keys = tuple(_key(h) for h in r.prefix_hashes)
            size = recorded.block_tokens or max(1, math.ceil(r.input_tokens / len(keys)))
        else:
            keys = tuple(hash((i, "whatif", k)) & _MASK for k in range(n_blocks))
            size = block
        out.append(Request(request_id=r.request_id, arrival_s=(r.arrival_ns - t0) / 1e9,
                           input_tokens=r.input_tokens, output_tokens=max(1, min(produced, cap)),
                           max_tokens=cap, block_keys=keys, block_tokens=size))
    return out


def _key(text: str) -> int:
    try:
        return int(text, 16) & _MASK
    except ValueError:
        return hash(("whatif-key", text)) & _MASK


def fleet_config(recorded: Recorded, calibration: Calibration, *, policy: str,
                 replicas: int | None = None, telemetry_interval_s: float | None = None,
                 kv_capacity_tokens: int | None = None) -> FleetConfig:
    """The testbed fleet that replays ``recorded``: its replicas (with their fitted speeds; added
    replicas are nominal, removed ones are the last by name), routers, telemetry interval,
    pending correction, admission limit and client timeout as recorded unless overridden."""
    import testbed

    n = replicas if replicas is not None else len(recorded.replicas)
    if n < 1:
        raise WhatIfError("the window shows no replica (no executions, no candidates): "
                          "pass --replicas N")
    overrides: dict[int, dict[str, Any]] = {}
    for i, name in enumerate(recorded.replicas[:n]):
        speed = calibration.speeds.get(name, 1.0)
        if speed != 1.0:
            overrides[i] = {"speed": speed}
    base = testbed.ReplicaConfig()
    kv = kv_capacity_tokens if kv_capacity_tokens is not None else calibration.kv_capacity_tokens
    replica = dataclasses.replace(base, kv_capacity_tokens=kv) if kv is not None else base
    router = testbed.RouterConfig(
        policy=policy,
        telemetry_interval_s=(telemetry_interval_s if telemetry_interval_s is not None
                              else recorded.telemetry_interval_s or 0.25),
        pending_correction=(recorded.pending_correction
                            if recorded.pending_correction is not None else True),
        n_routers=recorded.n_routers,
        admission_limit=recorded.admission_limit,
    )
    cfg = testbed.FleetConfig(n_replicas=n, replica=replica, replica_overrides=overrides,
                              router=router, cost=calibration.cost,
                              client_timeout_s=recorded.client_timeout_s, t0_ns=recorded.t0_ns)
    try:
        cfg.validate()
    except testbed.ConfigError as exc:
        raise WhatIfError(str(exc)) from None
    return cfg


# ------------------------------------------------------------------------------------------
# figures
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figures:
    """Latency and outcome figures of one run, judged like ``routeaudit compare`` does
    (``int_attr_requests_judged``): percentiles over ``ok`` requests, TTFT of a request without
    one is its latency, within SLO = ok and TTFT ≤ target and (TPOT ≤ target or < 2 tokens)."""

    label: str
    run_id: str | None
    policy: str | None
    replicas: int
    requests: int
    ok: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    within_slo: int
    goodput_rps: float | None
    timeouts: int
    rejected: int
    failed: int


def _quantile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between order statistics (DuckDB's ``quantile_cont``)."""
    if not xs:
        return None
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class _Outcome:
    status: str
    arrival_ms: float
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    output_tokens: int


def _figures(label: str, run_id: str | None, policy: str | None, replicas: int,
             outcomes: Sequence[_Outcome], slo: SLO) -> Figures:
    ok = [o for o in outcomes if o.status == "ok"]
    ttft = [o.ttft_ms for o in ok if o.ttft_ms is not None]
    tpot = [o.tpot_ms for o in ok if o.tpot_ms is not None]
    good = sum(1 for o in ok if o.ttft_ms is not None and o.ttft_ms <= slo.ttft_ms
               and (o.output_tokens < 2 or o.tpot_ms is None or o.tpot_ms <= slo.tpot_ms))
    start = min((o.arrival_ms for o in outcomes), default=0.0)
    end = max((o.arrival_ms + (o.e2e_ms or 0.0) for o in outcomes), default=0.0)
    return Figures(
        label=label, run_id=run_id, policy=policy, replicas=replicas, requests=len(outcomes),
        ok=len(ok), ttft_p50_ms=_quantile(ttft, 0.5), ttft_p90_ms=_quantile(ttft, 0.9),
        ttft_p99_ms=_quantile(ttft, 0.99), tpot_p50_ms=_quantile(tpot, 0.5),
        tpot_p90_ms=_quantile(tpot, 0.9), within_slo=good,
        goodput_rps=good / ((end - start) / 1000.0) if end > start else None,
        timeouts=sum(1 for o in outcomes if o.status in ("timeout", "cancelled")),
        rejected=sum(1 for o in outcomes if o.status == "rejected"),
        failed=sum(1 for o in outcomes if o.status not in ("ok", "timeout", "cancelled", "rejected")),
    )


OUTSIDE_NOTE_SHARE = 0.05
"""A note names the recorded TTFT spent outside the engines when its median is at least this
share of the recorded TTFT p50."""


def outside_engine_ms(recorded: Recorded) -> tuple[float, float] | None:
    """Median and p90 of the recorded TTFT spent outside the engines (client, network, router:
    TTFT minus the engine's own), over ok requests that have both; None without any."""
    gaps = [max(0.0, r.ttft_ms - r.engine_ttft_ms) for r in recorded.requests
            if r.status == "ok" and r.ttft_ms is not None and r.engine_ttft_ms is not None]
    if not gaps:
        return None
    p50, p90 = _quantile(gaps, 0.5), _quantile(gaps, 0.9)
    assert p50 is not None and p90 is not None
    return p50, p90


def figures_of_recorded(recorded: Recorded, slo: SLO) -> Figures:
    """The window's figures as the store recorded them."""
    outcomes = [_Outcome(r.status, r.arrival_ns / 1e6, r.ttft_ms, r.tpot_ms, r.e2e_ms,
                         r.output_tokens or 0) for r in recorded.requests]
    run = recorded.run_ids[0] if len(recorded.run_ids) == 1 else None
    return _figures("recorded", run, recorded.policy, len(recorded.replicas), outcomes, slo)


def figures_of_simulation(sim: Simulation, slo: SLO, label: str) -> Figures:
    """A finished simulation's figures, by the rules the store applies to its spans: a client
    timeout is ``cancelled``, a request no replica took ``rejected``."""
    outcomes = []
    for rec in sim.records:
        arrival = rec.req.arrival_s * 1000.0
        seq = rec.seq
        if rec.choice is None or rec.choice.index is None or seq is None:
            outcomes.append(_Outcome("rejected", arrival, None, None, 0.0, 0))
            continue
        e2e = ((seq.t_finish if seq.t_finish is not None else rec.t_decide) - rec.req.arrival_s) * 1000.0
        ttft = (None if seq.t_first_token is None
                else (seq.t_first_token - rec.req.arrival_s) * 1000.0)
        n = seq.generated
        tpot = (e2e - ttft) / (n - 1) if ttft is not None and n >= 2 else None
        status = "cancelled" if seq.finish_reason == "abort" else "ok"
        outcomes.append(_Outcome(status, arrival, ttft if ttft is not None else e2e, tpot, e2e, n))
    return _figures(label, sim.run_id, sim.cfg.router.policy, sim.cfg.n_replicas, outcomes, slo)


# ------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WhatIfResult:
    """What ``routeaudit whatif`` prints: the recorded figures, the replay under the recorded
    policy (None when the store names no policy the testbed knows), the what-if run, the
    calibration, and where the simulated runs were stored."""

    recorded: Figures
    replay: Figures | None
    whatif: Figures
    calibration: Calibration
    recorded_window: Recorded
    out: Path | None
    notes: tuple[str, ...] = ()


def _run_slug(recorded: Recorded) -> str:
    run = recorded.run_ids[0] if len(recorded.run_ids) == 1 else None
    return run if run is not None else "window"


def _relations_lag(reader: Reader) -> str | None:
    from audit import AuditError, queries

    try:
        return queries.describe_lag(queries.relations_freshness(reader))
    except AuditError:
        return None  # a store too old to say


def _existing_runs(out: Path) -> set[str]:
    if not out.exists():
        return set()
    import audit

    frame = audit.open(out).query("select distinct run_id from requests where run_id is not null")
    return {str(r) for r in frame["run_id"].to_list()}


def run_whatif(db: Path, *, policy: str, run: str | None = None, since: str | None = None,
               until: str | None = None, replicas: int | None = None,
               telemetry_interval_s: float | None = None, kv_capacity_tokens: int | None = None,
               out: Path | None = None, seed: int = 0, slo: SLO | None = None,
               progress: bool = True, log: Callable[[str], None] | None = None) -> WhatIfResult:
    """Replay a window of ``db`` under its recorded policy and under ``policy``; write both
    simulated runs into ``out`` (None: do not store them). Raises :class:`WhatIfError` (or an
    ``audit`` error for an unreadable store) before any simulation on bad input."""
    import audit
    import testbed

    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    if policy not in testbed.POLICIES:
        raise WhatIfError(f"unknown policy {policy!r}; known: {', '.join(sorted(testbed.POLICIES))}")
    if replicas is not None and replicas < 1:
        raise WhatIfError(f"--replicas must be >= 1, got {replicas}")
    if telemetry_interval_s is not None and not telemetry_interval_s > 0:
        raise WhatIfError(f"--telemetry-interval must be > 0, got {telemetry_interval_s}")
    if kv_capacity_tokens is not None and kv_capacity_tokens < 16:
        raise WhatIfError(f"--kv-capacity-tokens must hold one block, got {kv_capacity_tokens}")
    if out is not None and out.resolve() == Path(db).resolve():
        raise WhatIfError("--out must be another store than --db (the source may be in use by a "
                          "collector)")
    slo = slo or audit.SLO()
    started = time.perf_counter()
    reader = audit.open(db, slo=slo)
    recorded = load_recorded(reader, run=run, since=since, until=until)
    notes: list[str] = []
    lag = _relations_lag(reader)
    if lag is not None:
        # the replay reads the relations: spans not yet in them are traffic it does not see
        notes.append(f"{lag} The replay reads the relations only.")
        say(notes[-1])
    say(f"read {len(recorded.requests)} requests {recorded.description} from {db}"
        + (f" ({recorded.dropped} without input tokens skipped)" if recorded.dropped else ""))
    calibration = calibrate(reader, recorded)
    say(f"calibrated: {calibration.describe()}")
    requests = to_requests(recorded)
    renamed = [(f"replica-{i}", name) for i, name in enumerate(recorded.replicas)
               if name != f"replica-{i}"]
    if renamed:
        notes.append("simulated replicas are named by position: "
                     + ", ".join(f"{sim} = {name}" for sim, name in renamed[:8])
                     + (", …" if len(renamed) > 8 else ""))
    slug = _run_slug(recorded)
    plans: list[tuple[str, FleetConfig, str]] = []
    if recorded.policy in testbed.POLICIES:
        plans.append(("replay", fleet_config(recorded, calibration, policy=recorded.policy,
                                             kv_capacity_tokens=kv_capacity_tokens),
                      f"{slug}~replay-{recorded.policy}"))
    else:
        notes.append("the store names no routing policy the testbed knows "
                     f"({recorded.policy or 'none recorded'}): no replay under it")
    changes = "".join([f"-{replicas}r" if replicas is not None else "",
                       f"-{telemetry_interval_s:g}s" if telemetry_interval_s is not None else ""])
    plans.append(("what-if", fleet_config(recorded, calibration, policy=policy, replicas=replicas,
                                          telemetry_interval_s=telemetry_interval_s,
                                          kv_capacity_tokens=kv_capacity_tokens),
                  f"{slug}~whatif-{policy}{changes}"))
    if out is not None:
        taken = _existing_runs(out) & {run_id for _, _, run_id in plans}
        if taken:
            raise WhatIfError(f"{out} already holds run {sorted(taken)[0]!r}: choose another --out "
                              "or remove it")
    figures: dict[str, Figures] = {}

    def simulate(emitter: Any) -> None:
        for label, cfg, run_id in plans:
            say(f"simulating {len(requests)} requests under {cfg.router.policy} on "
                f"{cfg.n_replicas} replicas ({label}, run {run_id})")
            # a replay needs the outcomes, not the testbed's labels of them (about twice as fast)
            sim = testbed.Simulation(requests, cfg, seed=seed, scenario=label,
                                     emitter=emitter() if emitter else None,
                                     progress=progress, run_id=run_id, ground_truth=False)
            try:
                sim.run()
            finally:
                if sim.emitter is not None:
                    sim.emitter.close()
            figures[label] = figures_of_simulation(sim, slo, label)

    if out is None:
        simulate(None)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        from collectors.otlp import Collector, default_config
        from testbed.emit import OTelEmitter

        with Collector(default_config(db_path=out, http_port=0, grpc_port=None)) as collector:
            simulate(lambda: OTelEmitter(OTLPSpanExporter(endpoint=collector.traces_url,
                                                          timeout=60)))
            say(f"committing the simulated runs' spans to {out} and building its relations")
    say(f"done in {time.perf_counter() - started:.1f} s")
    rec_figures = figures_of_recorded(recorded, slo)
    outside = outside_engine_ms(recorded)
    if (outside is not None and rec_figures.ttft_p50_ms
            and outside[0] >= OUTSIDE_NOTE_SHARE * rec_figures.ttft_p50_ms):
        # the simulator has engines and routers, no client stack or network: such time is
        # missing from the simulated TTFT, whatever the policy
        notes.append(f"the recorded TTFT includes {outside[0]:,.0f} ms (p50; p90 {outside[1]:,.0f} "
                     "ms) outside the engines (client, network, router), which the replay does "
                     "not model")
    return WhatIfResult(recorded=rec_figures, replay=figures.get("replay"),
                        whatif=figures["what-if"], calibration=calibration,
                        recorded_window=recorded, out=out, notes=tuple(notes))


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _delta(x: float | None, ref: float | None) -> str:
    if x is None or ref is None or ref == 0:
        return ""
    return f" ({(x - ref) / ref * 100:+.0f}%)"


def format_whatif(result: WhatIfResult) -> str:
    """The side-by-side table ``routeaudit whatif`` prints, with how far the replay is from the
    recording (the model's error on this traffic) and what the what-if changes against it."""
    cols = [result.recorded, *([result.replay] if result.replay else []), result.whatif]
    base = result.replay
    rec = result.recorded

    def row(name: str, get: Callable[[Figures], float | int | None],
            fmt: Callable[[float | int | None], str], compare: bool = True) -> str:
        cells = []
        for f in cols:
            text = fmt(get(f))
            ref = rec if f is result.replay else base if f is result.whatif else None
            if compare and ref is not None and f is not rec:
                v, r = get(f), get(ref)
                text += _delta(None if v is None else float(v), None if r is None else float(r))
            cells.append(f"{text:>22s}")
        return f"{name:22s}" + "".join(cells)

    def count(x: float | int | None) -> str:
        return "-" if x is None else f"{int(x):,}"

    w = result.recorded_window
    span_s = (w.requests[-1].arrival_ns - w.requests[0].arrival_ns) / 1e9
    t0 = dt.datetime.fromtimestamp(w.t0_ns / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [
        f"what-if over {rec.requests:,} requests {w.description} (from {t0}, arrivals over "
        f"{span_s:,.0f} s)",
        f"calibration: {result.calibration.describe()}",
        "",
        f"{'':22s}" + "".join(f"{f.label:>22s}" for f in cols),
        f"{'policy':22s}" + "".join(f"{(f.policy or '?'):>22s}" for f in cols),
        row("replicas", lambda f: f.replicas, count, compare=False),
        row("requests", lambda f: f.requests, count, compare=False),
        row("TTFT p50 ms", lambda f: f.ttft_p50_ms, _ms),
        row("TTFT p90 ms", lambda f: f.ttft_p90_ms, _ms),
        row("TTFT p99 ms", lambda f: f.ttft_p99_ms, _ms),
        row("TPOT p50 ms", lambda f: f.tpot_p50_ms, lambda x: "-" if x is None else f"{x:.1f}"),
        row("TPOT p90 ms", lambda f: f.tpot_p90_ms, lambda x: "-" if x is None else f"{x:.1f}"),
        row("within SLO", lambda f: f.within_slo, count),
        row("goodput req/s", lambda f: f.goodput_rps,
            lambda x: "-" if x is None else f"{x:.2f}"),
        row("timeouts/cancelled", lambda f: f.timeouts, count, compare=False),
        row("rejected", lambda f: f.rejected, count, compare=False),
        row("failed", lambda f: f.failed, count, compare=False),
        "",
        "replay: the recorded policy on the calibrated model, % against recorded (the model's "
        "error on this traffic); what-if: % against the replay",
    ]
    lines.extend(f"note: {n}" for n in result.notes)
    if result.out is not None:
        runs = [f.run_id for f in cols[1:]]
        lines.append(f"simulated runs stored in {result.out}: {', '.join(str(r) for r in runs)}")
        if len(runs) == 2:
            lines.append(f"next: routeaudit compare --db {result.out} --baseline {runs[0]} "
                         f"--candidate {runs[1]}    or    routeaudit dashboard --db {result.out}")
    return "\n".join(lines)
