"""DecisionRecorder: routing decisions as OpenTelemetry spans (``opentelemetry-api`` only).

Contract for router authors:

* **Never raises into the router.** Every public method catches its own failures, logs them
  (rate-limited, logger ``collectors.router``), counts them in :attr:`DecisionRecorder.errors`
  and, when the decision span is still open, in ``routeaudit.decision.recorder_errors``.
  Exceptions raised *by the router's own code* inside a ``with`` block are recorded on the span
  and propagate unchanged.
* **Cheap.** ``candidate()`` only stores a tuple; attributes are built once, when the decision
  span ends, and set with one call. By default (``candidate_encoding="json"``) all candidates
  become one JSON string attribute (``routeaudit.decision.candidates``), formatted in C when the
  optional ``collectors/router/_native.c`` compiled, else by orjson; ``"events"`` emits one
  ``routeaudit.candidate`` span event per candidate instead. With the SDK's provider and export
  processors, spans go straight to the processors (:mod:`._direct_spans`). Without an
  OpenTelemetry SDK everything is a no-op except the trace-context headers, which still carry an
  incoming ``traceparent`` through.
* **No context juggling.** Spans are never made "current" (no contextvars attach/detach), so the
  same code works in threads, asyncio tasks and callbacks; parents are passed explicitly. The
  one context variable, set by ``RouterMiddleware`` / ``rec.serve()`` for one request, only
  tells ``decide()`` which router server span it belongs to (``._inbound``).
* **Misuse is survived, not raised.** Deciding after the block ended, choosing a replica that
  was not a candidate, ``None`` as a replica, a forward span never ended, ``respond()`` with no
  open span to carry it: each is logged once per recorder and kind (logger
  ``collectors.router``), counted in :attr:`DecisionRecorder.errors` and
  :attr:`DecisionRecorder.misuse`, and named in ``routeaudit.misuse`` on the span when it is
  still open.
* A decision object belongs to one request in one thread/task; the recorder itself is shared and
  thread-safe.
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from types import TracebackType
from typing import Any, Final, Literal

import orjson
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode

import semconv as sc

from ._direct_spans import DirectSpans
from ._inbound import Inbound, current_inbound
from ._records import DecisionRecord
from ._streams import async_relay, sync_relay

__all__ = [
    "CandidateEncoding", "Decision", "DecisionRecorder", "Forward", "INSTRUMENTATION_NAME",
    "Misuse",
]

CandidateEncoding = Literal["json", "events"]
"""How candidates are recorded: ``"json"`` (one string attribute, the default) or ``"events"``."""

INSTRUMENTATION_NAME: Final = "routeaudit.router"
"""Instrumentation scope name of the spans this module emits."""

_VERSION: Final = "0.1.0"
_LOG = logging.getLogger("collectors.router")
_LOG_INTERVAL_S: Final = 10.0

Misuse = Literal[
    "decided_after_end", "chosen_not_candidate", "none_replica", "forward_not_ended",
    "respond_without_span",
]
"""Kinds of instrumentation mistake the recorder survives (values of ``routeaudit.misuse``)."""

_T_BOOL, _T_STR, _T_INT, _T_FLOAT = 0, 1, 2, 3
# Candidate fields after ``replica``, in the order Decision.candidate() stores them.
_CANDIDATE_FIELDS: Final[tuple[tuple[str, int], ...]] = (
    (sc.CANDIDATE_ELIGIBLE, _T_BOOL),
    (sc.CANDIDATE_EXCLUDED_REASON, _T_STR),
    (sc.CANDIDATE_WAITING, _T_INT),
    (sc.CANDIDATE_RUNNING, _T_INT),
    (sc.CANDIDATE_KV_USAGE, _T_FLOAT),
    (sc.CANDIDATE_REMAINING_TOKENS, _T_INT),
    (sc.CANDIDATE_TELEMETRY_TS, _T_INT),
    (sc.CANDIDATE_PENDING, _T_INT),
    (sc.CANDIDATE_PREDICTED_CACHED_TOKENS, _T_INT),
    (sc.CANDIDATE_EST_QUEUE_MS, _T_FLOAT),
    (sc.CANDIDATE_EST_PREFILL_MS, _T_FLOAT),
    (sc.CANDIDATE_SCORE, _T_FLOAT),
    (sc.REPLICA_DP_RANK, _T_INT),
)
_TELEMETRY_TS_INDEX: Final = 7  # position of telemetry_ts_ns in the stored tuple


# Header mappings whose get() is already case-insensitive (starlette, httpx, multidict, werkzeug):
# a miss needs no scan of every header.
_CASE_INSENSITIVE: Final = frozenset(
    {"Headers", "MutableHeaders", "CIMultiDict", "CIMultiDictProxy", "EnvironHeaders"}
)


class _HeaderGetter(Getter[Any]):
    """Case-insensitive header lookup for dicts, starlette/httpx Headers and lists of pairs."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        if isinstance(carrier, Mapping):
            value = carrier.get(key)
            if value is None and type(carrier).__name__ not in _CASE_INSENSITIVE:
                for k, v in carrier.items():
                    if isinstance(k, str) and k.lower() == key:
                        value = v
                        break
        else:
            value = None
            for k, v in carrier:
                if isinstance(k, bytes):
                    k = k.decode("latin-1")
                if k.lower() == key:
                    value = v.decode("latin-1") if isinstance(v, bytes) else v
                    break
        if value is None:
            return None
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        return [value] if isinstance(value, str) else list(value)

    def keys(self, carrier: Any) -> list[str]:
        if isinstance(carrier, Mapping):
            return [str(k) for k in carrier.keys()]
        return [k.decode("latin-1") if isinstance(k, bytes) else k for k, _ in carrier]


HEADER_GETTER: Final = _HeaderGetter()


def extract_context(headers: Any) -> Context:
    """Trace context (and baggage) from incoming headers, via the global propagator."""
    return propagate.extract(headers, getter=HEADER_GETTER)


def header_value(headers: Any, name: str) -> str | None:
    """One header's value, case-insensitively; None when absent."""
    got = HEADER_GETTER.get(headers, name)
    return got[0] if got else None


def _coerce(value: Any, kind: int) -> Any:
    """Value as the attribute type of its column; raises on a value that cannot be converted."""
    t = type(value)
    if kind == _T_INT:
        return value if t is int else int(value)
    if kind == _T_FLOAT:
        return value if (t is float or t is int) else float(value)
    if kind == _T_BOOL:
        return value if t is bool else bool(value)
    return value if t is str else str(value)


class DecisionRecorder:
    """Records a router's decisions: one ``routeaudit.decision`` span per attempt.

    ``tracer_provider`` None means the global provider (resolved lazily, so the SDK may be set up
    after the recorder is built). ``candidate_encoding``: ``"json"`` (default) puts all candidates
    in the one string attribute ``routeaudit.decision.candidates``; ``"events"`` adds one
    ``routeaudit.candidate`` span event per candidate (the original form; both are read by the
    collector). See the module docstring for the error contract.

    ``direct_spans`` (default True): with the OpenTelemetry SDK's provider and export processors,
    hand finished spans straight to the processors instead of building the SDK's mutable spans:
    the same spans, for a fraction of the cost (``collectors/router/_direct_spans.py`` says when
    it applies). False always takes the SDK's ``Tracer.start_span``.
    """

    def __init__(
        self,
        policy: str,
        router_id: str | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        candidate_encoding: CandidateEncoding = "json",
        *,
        direct_spans: bool = True,
    ) -> None:
        if candidate_encoding not in ("json", "events"):
            raise ValueError(f"candidate_encoding must be 'json' or 'events', not {candidate_encoding!r}")
        self.policy = str(policy)
        self.candidate_encoding: CandidateEncoding = candidate_encoding
        self._json = candidate_encoding == "json"
        self.router_id = None if router_id is None else str(router_id)
        self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, _VERSION, tracer_provider)
        self._direct: DirectSpans | None = None
        self._direct_resolved = not direct_spans
        self._lock = threading.Lock()
        self._errors = 0
        self._last_log = 0.0
        self._suppressed = 0
        self._misuse: dict[str, int] = {}
        base: dict[str, Any] = {sc.COMPONENT: "router", sc.ROUTER_POLICY: self.policy}
        if self.router_id is not None:
            base[sc.ROUTER_ID] = self.router_id
        self._base_attrs = base

    @property
    def errors(self) -> int:
        """Internal errors swallowed so far (all decisions of this recorder)."""
        return self._errors

    @property
    def misuse(self) -> dict[str, int]:
        """Instrumentation mistakes survived so far, by kind (also counted in :attr:`errors`)."""
        with self._lock:
            return dict(self._misuse)

    # ------------------------------------------------------------------ live API
    def serve(
        self,
        incoming_headers: Any = None,
        *,
        method: str = "POST",
        path: str | None = None,
        request_id: str | None = None,
        parent_context: Context | None = None,
    ) -> Inbound:
        """Open the router's SERVER span for one incoming request (what :class:`RouterMiddleware`
        does for ASGI routers); use as ``with``/``async with rec.serve(...) as s:``.

        Parent: ``parent_context``, else the trace context of ``incoming_headers``. ``request_id``
        None takes the ``x-request-id`` header, else a generated id. While entered, decisions
        opened in the same thread or task are its children, share its request id, and their
        ``respond()`` / ``first_byte()`` land on it.
        """
        parent = parent_context
        rid = request_id
        try:
            if parent is None and incoming_headers is not None:
                parent = extract_context(incoming_headers)
            if rid is None and incoming_headers is not None:
                rid = header_value(incoming_headers, "x-request-id")
        except Exception as exc:
            self._fail(exc)
        return Inbound(self, parent, str(rid) if rid else os.urandom(16).hex(), str(method), path)

    def decide(
        self,
        request_id: str | None,
        *,
        model: str | None = None,
        input_tokens: int | None = None,
        max_tokens: int | None = None,
        prefix_hashes: Sequence[str] | None = None,
        stream: bool | None = None,
        endpoint: str | None = None,
        attempt: int = 0,
        parent_context: Context | None = None,
        incoming_headers: Any = None,
    ) -> Decision:
        """Open the decision span of one attempt; use as ``with rec.decide(...) as d:`` or
        ``async with``.

        The span starts now. Parent: ``parent_context``, else the router's server span (inside
        :class:`RouterMiddleware` or ``rec.serve()``), else the trace context extracted from
        ``incoming_headers``, else the current context. ``request_id`` None takes the server
        span's request id, else the incoming ``x-request-id`` header, else a generated id.
        ``model``, ``input_tokens``, ``max_tokens``, ``prefix_hashes`` (chained prefix block
        hashes, no text), ``stream`` and ``endpoint`` describe the request as the router saw it;
        ``attempt`` numbers retries (a retry is a new ``decide()``).
        """
        return Decision(
            self, request_id, model, input_tokens, max_tokens, prefix_hashes, stream, endpoint,
            attempt, parent_context, incoming_headers,
        )

    # ------------------------------------------------------------------ after-the-fact API
    def record(self, rec: DecisionRecord) -> Context | None:
        """Emit a complete decision (and its forward span) with explicit timestamps.

        Returns the Context of the forward span (or of the decision span when there is no
        forward) for parenting the replica's span; None when recording failed.
        """
        try:
            start = rec.start_ns if rec.start_ns is not None else rec.decided_ns
            attrs = self._request_attrs(
                rec.request_id, rec.attempt, rec.model, rec.input_tokens, rec.max_tokens,
                rec.prefix_hashes, rec.stream, rec.endpoint,
            )
            span = self._start_span(
                sc.SPAN_DECISION, rec.parent_context, SpanKind.INTERNAL, attrs, int(start)
            )
            errors = 0
            chosen_index = -1
            rows: list[tuple[Any, ...]] = []
            for i, c in enumerate(rec.candidates):
                rows.append((
                    c.replica, c.eligible, c.excluded_reason, c.waiting, c.running, c.kv_usage,
                    c.remaining_tokens, c.telemetry_ts_ns, c.pending, c.predicted_cached_tokens,
                    c.est_queue_ms, c.est_prefill_ms, c.score, c.dp_rank,
                ))
                if rec.chosen is not None and chosen_index < 0 and c.replica == rec.chosen:
                    chosen_index = i
            decided = int(rec.decided_ns)
            candidates_json = None
            if not self._json:
                errors += _emit_candidates(span, rows, chosen_index, decided)
            elif rows:
                candidates_json, errors = _candidates_json(rows, chosen_index, decided)
            final = _final_attrs(
                rec.chosen, rec.reason, rec.outcome, len(rows), decided, errors, candidates_json
            )
            span.set_attributes(final)
            if rec.outcome == "error":
                span.set_status(Status(StatusCode.ERROR, rec.reason))
            if errors:
                self._count(errors, "bad candidate values in record()")
            parent = rec.parent_context
            span_ctx = trace.set_span_in_context(span, parent)
            result = span_ctx
            if rec.forward_url is not None or rec.forward_start_ns is not None:
                f_start = int(rec.forward_start_ns if rec.forward_start_ns is not None
                              else rec.decided_ns)
                fwd = self._start_span(
                    sc.SPAN_FORWARD, span_ctx, SpanKind.CLIENT,
                    _forward_attrs(rec.request_id, rec.attempt, rec.forward_url, rec.chosen),
                    f_start,
                )
                if rec.forward_http_status is not None:
                    _set_status_code(fwd, int(rec.forward_http_status))
                fwd.end(int(rec.forward_end_ns) if rec.forward_end_ns is not None else f_start)
                result = trace.set_span_in_context(fwd, parent)
            span.end(int(rec.end_ns) if rec.end_ns is not None else max(start, rec.decided_ns))
            return result
        except Exception as exc:  # never raise into the caller
            self._fail(exc)
            return None

    # ------------------------------------------------------------------ internals
    def _start_span(
        self, name: str, context: Context | None, kind: SpanKind, attributes: dict[str, Any],
        start_time: int | None = None,
    ) -> trace.Span:
        direct = self._direct
        if direct is None and not self._direct_resolved:
            direct = self._resolve_direct()
        if direct is not None and direct.usable():
            return direct.start(name, context, kind, attributes, start_time)
        return self._tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, start_time=start_time
        )

    def _resolve_direct(self) -> DirectSpans | None:
        """Decide once whether the provider allows direct spans (after it is set up)."""
        tracer = self._tracer
        if isinstance(tracer, trace.ProxyTracer):
            if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
                return None  # no SDK set up yet: ask again at the next span
            tracer = self._tracer = trace.get_tracer(INSTRUMENTATION_NAME, _VERSION)
        self._direct = DirectSpans.of(tracer)
        self._direct_resolved = True
        return self._direct

    def _request_attrs(
        self, request_id: str, attempt: int, model: Any, input_tokens: Any, max_tokens: Any,
        prefix_hashes: Any, stream: Any, endpoint: Any,
    ) -> dict[str, Any]:
        attrs = self._base_attrs.copy()
        attrs[sc.REQUEST_ID] = request_id
        attrs[sc.ATTEMPT] = attempt
        if model is not None:
            attrs[sc.REQUEST_MODEL] = model
        if input_tokens is not None:
            attrs[sc.REQUEST_INPUT_TOKENS] = input_tokens
        if max_tokens is not None:
            attrs[sc.REQUEST_MAX_TOKENS] = max_tokens
        if prefix_hashes is not None:
            attrs[sc.REQUEST_PREFIX_HASHES] = tuple([str(h) for h in prefix_hashes])
        if stream is not None:
            attrs[sc.REQUEST_STREAM] = bool(stream)
        if endpoint is not None:
            attrs[sc.REQUEST_ENDPOINT] = endpoint
        return attrs

    def _count(self, n: int, what: str) -> None:
        with self._lock:
            self._errors += n
        self._log(what)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._errors += 1
        self._log(f"{type(exc).__name__}: {exc}", exc)

    def _misused(self, kind: Misuse, detail: str) -> None:
        """Count one instrumentation mistake; the first of each kind is logged."""
        with self._lock:
            self._errors += 1
            n = self._misuse.get(kind, 0)
            self._misuse[kind] = n + 1
        if n == 0:
            _LOG.warning(
                "routeaudit router instrumentation misuse (%s): %s. The router is unaffected; "
                "later occurrences are counted in DecisionRecorder.errors and .misuse, not "
                "logged", kind, detail,
            )

    def _log(self, what: str, exc: BaseException | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_log < _LOG_INTERVAL_S and self._last_log:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last_log = self._suppressed, 0, now
        _LOG.warning(
            "routeaudit decision recorder error (router unaffected): %s%s", what,
            f" ({suppressed} similar errors suppressed)" if suppressed else "",
            exc_info=exc,
        )


def _emit_candidates(
    span: trace.Span, rows: Iterable[tuple[Any, ...]], chosen_index: int, decided_ns: int
) -> int:
    """Add one candidate event per row; returns the number of values that had to be dropped."""
    errors = 0
    add_event = span.add_event
    name = sc.EVENT_CANDIDATE
    for i, row in enumerate(rows):
        attrs: dict[str, Any] = {sc.CANDIDATE_REPLICA: str(row[0])}
        for (key, kind), value in zip(_CANDIDATE_FIELDS, row[1:], strict=False):
            if value is None:
                continue
            try:
                attrs[key] = _coerce(value, kind)
            except Exception:
                errors += 1
        ts = attrs.get(sc.CANDIDATE_TELEMETRY_TS)
        if ts is not None:
            attrs[sc.CANDIDATE_TELEMETRY_AGE_MS] = (decided_ns - ts) / 1e6
        attrs[sc.CANDIDATE_CHOSEN] = i == chosen_index
        add_event(name, attrs, decided_ns)
    return errors


# ---------------------------------------------------------------------------- JSON encoding
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_NONE_TYPE: Final = type(None)
# (JSON key, kind) of every stored tuple position, replica first (see Decision.candidate()).
_JSON_SPEC: Final[tuple[tuple[str, int], ...]] = (
    (sc.CANDIDATE_JSON_KEYS[sc.CANDIDATE_REPLICA], _T_STR),
    *((sc.CANDIDATE_JSON_KEYS[key], kind) for key, kind in _CANDIDATE_FIELDS),
)
_AGE_KEY: Final = sc.CANDIDATE_JSON_KEYS[sc.CANDIDATE_TELEMETRY_AGE_MS]
_CHOSEN_KEY: Final = sc.CANDIDATE_JSON_KEYS[sc.CANDIDATE_CHOSEN]
_ENCODER_CACHE_MAX: Final = 256
_JSON_KEYS: Final = tuple(key for key, _kind in _JSON_SPEC)
_JSON_TYPES: Final = {_T_STR: (str,), _T_BOOL: (bool,), _T_INT: (int,), _T_FLOAT: (int, float)}


try:  # the C formatter (collectors/router/_native.c), when it compiled
    from collectors.router import _native  # type: ignore[attr-defined]

    _native.configure(
        tuple((f'"{key}":', kind) for key, kind in _JSON_SPEC), _TELEMETRY_TS_INDEX,
        f'"{_AGE_KEY}":', f'"{_CHOSEN_KEY}":', encode_basestring_ascii,
    )
    _native_candidates_json: Callable[[list[Any], int, int], str | None] | None = (
        _native.candidates_json
    )
except ImportError:
    _native_candidates_json = None


class _Plan:
    """How rows whose values have exactly the types of one signature become a dict: which
    positions are set, under which keys, which need the int64 check, where the telemetry age
    goes."""

    __slots__ = ("get", "keys", "ints", "age_at")

    def __init__(self, sig: tuple[type, ...]) -> None:
        positions = [i for i, t in enumerate(sig) if t is not _NONE_TYPE]
        keys = [_JSON_KEYS[i] for i in positions]
        self.age_at = -1
        if _TELEMETRY_TS_INDEX in positions:
            self.age_at = positions.index(_TELEMETRY_TS_INDEX) + 1
            keys.insert(self.age_at, _AGE_KEY)
        self.keys = tuple(keys) + (_CHOSEN_KEY,)
        self.get = operator.itemgetter(*positions) if len(positions) > 1 else (
            lambda row, i=positions[0]: (row[i],))
        ints = [i for i in positions if sig[i] is int]
        self.ints = operator.itemgetter(*ints, *ints[:1]) if ints else None  # a tuple, even for one


_plans: dict[tuple[type, ...], _Plan | None] = {}


def _plan(sig: tuple[type, ...]) -> _Plan | None:
    """The plan for rows of this signature, or None when their values need coercion (a type
    other than the field's; cached per signature, bounded)."""
    try:
        return _plans[sig]
    except KeyError:
        pass
    ok = (len(sig) == len(_JSON_SPEC) and sig[0] is str
          and all(t is _NONE_TYPE or t in _JSON_TYPES[kind] for (_key, kind), t in zip(_JSON_SPEC, sig, strict=True)))
    plan = _Plan(sig) if ok else None
    if len(_plans) < _ENCODER_CACHE_MAX:
        _plans[sig] = plan
    return plan


def _row_checked(row: tuple[Any, ...], decided_ns: int, chosen: bool) -> tuple[dict[str, Any], int]:
    """One row as a dict, value by value (any types); returns (dict, values dropped).

    Values are coerced to their field's type as in the events encoding; a value that cannot be
    converted, or an integer outside int64, is dropped and counted; a non-finite float is null.
    """
    obj: dict[str, Any] = {}
    errors = 0
    for i, ((key, kind), value) in enumerate(zip(_JSON_SPEC, row, strict=False)):
        if value is None:
            continue
        try:
            v = _coerce(value, kind)
            if kind == _T_INT:
                if not _INT64_MIN <= v <= _INT64_MAX:
                    raise OverflowError("integer outside int64")
            elif kind == _T_FLOAT:
                if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX:
                    v = float(v)
                if v - v != 0:
                    v = None
        except Exception:
            errors += 1
            continue
        obj[key] = v
        if i == _TELEMETRY_TS_INDEX:
            obj[_AGE_KEY] = (decided_ns - v) / 1e6
    obj[_CHOSEN_KEY] = chosen
    return obj, errors


def _candidates_json(
    rows: Sequence[tuple[Any, ...]], chosen_index: int, decided_ns: int
) -> tuple[str, int]:
    """All rows as the value of ``routeaudit.decision.candidates``; returns (json, values dropped).

    The C formatter takes the call when every value already has its field's type (4.4 µs for 8
    candidates against about 18 µs here: docs/performance.md); it declines (None) otherwise.
    Here, rows whose values have their fields' types become dicts by a cached per-signature plan
    (no per-value Python); the others are coerced value by value (:func:`_row_checked`). orjson
    writes the list (a non-finite float as null). Both give the same JSON values, keys in the
    same order."""
    if _native_candidates_json is not None and type(rows) is list:
        try:
            text = _native_candidates_json(rows, chosen_index, decided_ns)
        except Exception:
            text = None
        if text is not None:
            return text, 0
    objs: list[dict[str, Any]] = []
    errors = 0
    for i, row in enumerate(rows):
        plan = _plan(tuple(map(type, row)))
        if plan is not None:
            values = plan.get(row)
            ints = plan.ints
            if ints is None or (_INT64_MIN <= min(ints(row)) and max(ints(row)) <= _INT64_MAX):
                if plan.age_at >= 0:
                    at = plan.age_at
                    values = values[:at] + ((decided_ns - values[at - 1]) / 1e6,) + values[at:]
                objs.append(dict(zip(plan.keys, values + (i == chosen_index,), strict=True)))
                continue
        obj, bad = _row_checked(row, decided_ns, i == chosen_index)
        errors += bad
        objs.append(obj)
    try:
        return orjson.dumps(objs).decode(), errors
    except TypeError:
        # orjson refuses a str holding a lone surrogate (a replica name from bad input); the
        # standard encoder writes it escaped, still valid JSON, so the decision is not lost.
        return json.dumps(objs, allow_nan=False, separators=(",", ":")), errors


def _final_attrs(
    chosen: Any, reason: Any, outcome: Any, count: int, decided_ns: int, errors: int,
    candidates_json: str | None = None,
) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        sc.DECISION_OUTCOME: str(outcome),
        sc.DECISION_CANDIDATE_COUNT: count,
        sc.DECISION_TIME: decided_ns,
    }
    if candidates_json is not None:
        attrs[sc.DECISION_CANDIDATES] = candidates_json
    if chosen is not None:
        attrs[sc.DECISION_CHOSEN] = str(chosen)
    if reason is not None:
        attrs[sc.DECISION_REASON] = str(reason)
    if errors:
        attrs[sc.DECISION_RECORDER_ERRORS] = errors
    return attrs


def _forward_attrs(request_id: str, attempt: int, url: Any, replica: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        sc.COMPONENT: "router", sc.REQUEST_ID: request_id, sc.ATTEMPT: attempt,
        sc.HTTP_METHOD: "POST",
    }
    if url is not None:
        attrs[sc.URL_FULL] = str(url)
    if replica is not None:
        attrs[sc.REPLICA_ID] = str(replica)
    return attrs


def _set_status_code(span: trace.Span, code: int) -> None:
    span.set_attribute(sc.HTTP_STATUS, code)
    if code >= 400:  # OTel HTTP semconv: 4xx and 5xx are errors on CLIENT spans
        span.set_status(Status(StatusCode.ERROR))


class Decision:
    """One routing attempt in progress (returned by :meth:`DecisionRecorder.decide`)."""

    __slots__ = (
        "_rec", "request_id", "attempt", "_span", "_parent", "_rows", "_chosen", "_chosen_index",
        "_reason", "_outcome", "_decided_ns", "_errors", "_forward", "_ended", "_server",
        "_misuse", "_start_ns",
    )

    def __init__(
        self, rec: DecisionRecorder, request_id: str | None, model: Any, input_tokens: Any,
        max_tokens: Any, prefix_hashes: Any, stream: Any, endpoint: Any, attempt: int,
        parent_context: Context | None, incoming_headers: Any,
    ) -> None:
        self._rec = rec
        self._rows: list[tuple[Any, ...]] = []
        self._chosen: str | None = None
        self._chosen_index = -1
        self._reason: str | None = None
        self._outcome: str | None = None
        self._decided_ns = 0
        self._errors = 0
        self._forward: Forward | None = None
        self._ended = False
        self._misuse: list[str] | None = None
        self._span: trace.Span = trace.INVALID_SPAN
        self._parent = parent_context
        self._server = server = current_inbound()
        self._start_ns = time.time_ns()
        self.attempt = attempt
        self.request_id = "" if request_id is None else str(request_id)
        try:
            if server is not None:
                server._decisions.append(self)
                if parent_context is None:
                    self._parent = server.context
            elif parent_context is None and incoming_headers is not None:
                self._parent = extract_context(incoming_headers)
            if request_id is None:
                rid = server.request_id if server is not None else None
                if rid is None and incoming_headers is not None:
                    rid = header_value(incoming_headers, "x-request-id")
                self.request_id = rid or os.urandom(16).hex()
            attrs = rec._request_attrs(
                self.request_id, attempt, model, input_tokens, max_tokens, prefix_hashes, stream,
                endpoint,
            )
            self._span = rec._start_span(
                sc.SPAN_DECISION, self._parent, SpanKind.INTERNAL, attrs, self._start_ns)
        except Exception as exc:
            # Keep the incoming trace flowing to the replica even without a span of our own.
            self._span = trace.NonRecordingSpan(
                trace.get_current_span(self._parent).get_span_context())
            self._error(exc)

    # -- context managers (the block's end is the decision span's end)
    def __enter__(self) -> Decision:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(ev)

    async def __aenter__(self) -> Decision:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(ev)

    # -- recording
    def candidate(
        self, replica: str, *, eligible: bool = True, excluded_reason: str | None = None,
        waiting: int | None = None, running: int | None = None, kv_usage: float | None = None,
        remaining_tokens: int | None = None, telemetry_ts_ns: int | None = None,
        pending: int | None = None, predicted_cached_tokens: int | None = None,
        est_queue_ms: float | None = None, est_prefill_ms: float | None = None,
        score: float | None = None, dp_rank: int | None = None,
    ) -> None:
        """Note one candidate replica and the telemetry the router saw for it (cheap).

        ``dp_rank``: the engine's DP rank when ``replica`` runs several (``routeaudit.replica.dp_rank``).
        ``replica`` None is a misuse: the candidate is left out.
        """
        if replica is None:
            self._misused("none_replica", "candidate(None): the candidate is left out")
            return
        if self._ended:
            self._misused("decided_after_end", "candidate() after the decide block ended: lost")
            return
        self._rows.append((
            replica, eligible, excluded_reason, waiting, running, kv_usage, remaining_tokens,
            telemetry_ts_ns, pending, predicted_cached_tokens, est_queue_ms, est_prefill_ms, score,
            dp_rank,
        ))

    def choose(self, replica: str, reason: str | None = None, *, outcome: str = "routed") -> None:
        """The decision: ``replica`` gets the request. Marks the decision instant.

        Call it inside the ``decide`` block: afterwards the decision span has ended and the
        choice only names the replica of a later ``forward()``. ``replica`` None is a misuse
        (use ``reject()`` when nobody gets the request).
        """
        if replica is None:
            self._misused("none_replica", "choose(None): use reject() when no replica is chosen")
            return
        if self._ended:
            self._misused(
                "decided_after_end",
                "choose() after the decide block ended: the decision span is already recorded "
                "without it; call choose() inside the block")
            self._chosen = replica
            return
        self._decided_ns = time.time_ns()
        self._chosen = replica
        self._reason = reason
        self._outcome = outcome

    def reject(self, reason: str | None = None, *, outcome: str = "rejected") -> None:
        """No replica gets the request (admission limit, no eligible replica, queue...)."""
        if self._ended:
            self._misused("decided_after_end", "reject() after the decide block ended: lost")
            return
        self._decided_ns = time.time_ns()
        self._chosen = None
        self._reason = reason
        self._outcome = outcome

    def forward(self, url: str, *, replica: str | None = None) -> Forward:
        """Start the ``routeaudit.forward`` CLIENT span (child of the decision span) now.

        ``replica`` defaults to the chosen replica. Send ``Forward.headers`` to the replica.
        Use as ``with``/``async with`` or call ``end()``; ``Forward.stream()`` /
        ``Forward.astream()`` hand the end to the relayed body. May outlive the ``decide``
        block (it normally comes after it).
        """
        fwd = Forward(self, url, replica if replica is not None else self._chosen)
        self._forward = fwd
        return fwd

    def respond(self, status: int) -> None:
        """The HTTP status the router answers its client with.

        Recorded on the router's server span (``RouterMiddleware``, ``rec.serve()``; the
        middleware records it by itself), else on the decision span while it is open; with
        neither, a misuse (``respond_without_span``).
        """
        server = self._server
        if server is not None:
            server.respond(status)
            return
        if self._ended:
            self._misused(
                "respond_without_span",
                "respond() after the decide block ended with no server span to carry it: use "
                "RouterMiddleware or rec.serve(), or respond inside the block")
            return
        try:
            code = int(status)
            self._span.set_attribute(sc.HTTP_STATUS, code)
            if code >= 500:
                self._span.set_status(Status(StatusCode.ERROR))
        except Exception as exc:
            self._error(exc)

    def first_byte(self) -> None:
        """Mark now as the first response body byte the router sent (router-side TTFT).

        ``Forward.stream()`` / ``astream()`` and ``RouterMiddleware`` mark it by themselves.
        Recorded on the server span, else on the decision span while it is open; with neither,
        a misuse (``respond_without_span``).
        """
        if not self._first_byte(now=time.time_ns()):
            self._misused(
                "respond_without_span",
                "first_byte() after the decide block ended with no server span to carry it")

    def outgoing_headers(self) -> dict[str, str]:
        """Headers to send to the replica: of the open forward span, else of the decision span."""
        if self._forward is not None and not self._forward._ended:
            return dict(self._forward.headers)
        return self._headers_for(self._span)

    @property
    def context(self) -> Context:
        """Context holding the decision span (for parenting spans of the router's own)."""
        return trace.set_span_in_context(self._span, self._parent)

    def end(self, exc: BaseException | None = None) -> None:
        """End the decision span (done by the ``with`` block; safe to call twice)."""
        if self._ended:
            return
        rows = self._rows
        chosen_index = -1
        if self._chosen is not None:
            for i, row in enumerate(rows):
                if row[0] == self._chosen:
                    chosen_index = i
                    break
            if chosen_index < 0 and rows:
                self._misused(
                    "chosen_not_candidate",
                    f"choose({self._chosen!r}) names a replica that was not passed to "
                    "candidate(): recorded as chosen, with no telemetry")
        self._ended = True
        span = self._span
        try:
            if not span.is_recording():
                return
            decided = self._decided_ns or time.time_ns()
            candidates_json = None
            if not self._rec._json:
                bad = _emit_candidates(span, rows, chosen_index, decided)
            elif rows:
                candidates_json, bad = _candidates_json(rows, chosen_index, decided)
            else:
                bad = 0
            self._errors += bad
            outcome, reason = self._outcome, self._reason
            if outcome is None:
                outcome = "error"
                if reason is None:
                    reason = "exception" if exc is not None else "no_decision"
            if exc is not None:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            final = _final_attrs(self._chosen, reason, outcome, len(rows), decided, self._errors,
                                 candidates_json)
            if self._misuse:
                final[sc.MISUSE] = tuple(self._misuse)
            span.set_attributes(final)
            if bad:
                self._rec._count(bad, f"request {self.request_id!r}: bad candidate values")
        except Exception as e:
            self._rec._fail(e)
        finally:
            try:
                span.end()
            except Exception as e:
                self._rec._fail(e)

    # -- internals
    def _first_byte(self, now: int) -> bool:
        """Mark the first byte on the server span, else the open decision span; False when
        neither can carry it."""
        server = self._server
        if server is not None:
            server.first_byte()
            return True
        if self._ended:
            return False
        try:
            self._span.set_attribute(sc.ROUTER_TTFB_MS, (now - self._start_ns) / 1e6)
        except Exception as exc:
            self._error(exc)
        return True

    def _misused(self, kind: Misuse, detail: str) -> None:
        """Count a mistake; name it on this decision's span, else on its open forward span."""
        try:
            self._rec._misused(kind, f"request {self.request_id!r}: {detail}")
            if not self._ended:
                if self._misuse is None:
                    self._misuse = []
                self._misuse.append(kind)
            elif self._forward is not None and not self._forward._ended:
                self._forward._add_misuse(kind)
        except Exception as exc:  # never raise into the router
            self._rec._fail(exc)

    def _error(self, exc: BaseException) -> None:
        self._errors += 1
        with self._rec._lock:
            self._rec._errors += 1
        self._rec._log(f"{type(exc).__name__}: {exc}", exc)
        self._errors_to_span()

    def _errors_to_span(self) -> None:
        try:
            if self._span.is_recording():
                self._span.set_attribute(sc.DECISION_RECORDER_ERRORS, self._errors)
        except Exception:
            pass

    def _headers_for(self, span: trace.Span) -> dict[str, str]:
        headers: dict[str, str] = {}
        try:
            propagate.inject(headers, context=trace.set_span_in_context(span, self._parent))
        except Exception as exc:
            self._error(exc)
        headers["x-request-id"] = self.request_id
        return headers


class Forward:
    """The router's call to the chosen replica (``routeaudit.forward``, kind CLIENT).

    Ends by ``end()``, by leaving its ``with``/``async with`` block, or, once ``stream()`` /
    ``astream()`` wrapped the replica's body, when that body is done (completed, cancelled by the
    client, or broken). A forward span the router never ends is closed by the recorder with an
    error mark (``forward_not_ended``) when the router's server span ends or the object is
    garbage-collected.
    """

    __slots__ = ("_decision", "_span", "headers", "_ended", "_relayed", "_misuse")

    def __init__(self, decision: Decision, url: str, replica: str | None) -> None:
        self._decision = decision
        self._ended = False
        self._relayed = False
        self._misuse: list[str] | None = None
        self._span: trace.Span = trace.INVALID_SPAN
        try:
            self._span = decision._rec._start_span(
                sc.SPAN_FORWARD, trace.set_span_in_context(decision._span, decision._parent),
                SpanKind.CLIENT,
                _forward_attrs(decision.request_id, decision.attempt, url, replica),
            )
        except Exception as exc:
            self._span = trace.NonRecordingSpan(decision._span.get_span_context())
            decision._error(exc)
        self.headers: dict[str, str] = decision._headers_for(self._span)
        """Headers to send: ``traceparent`` (+ ``tracestate``/``baggage``), ``x-request-id``."""

    @property
    def context(self) -> Context:
        """Context holding the forward span (parent of the replica's span)."""
        return trace.set_span_in_context(self._span, self._decision._parent)

    def __enter__(self) -> Forward:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if ev is not None or not self._relayed:
            self.end(ev)

    async def __aenter__(self) -> Forward:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if ev is not None or not self._relayed:
            self.end(ev)

    def stream(self, body: Any) -> Iterator[bytes]:
        """Relay a replica's body, ending this span when it is done.

        ``body``: an iterable of chunks, or a streamed sync ``httpx.Response`` (its status is
        recorded now; read raw; closed at the end). The first non-empty chunk marks the router's
        first byte; a consumer that stops early ends the span as ``cancelled``; an error of the
        body ends it with that error and is re-raised. Leaving an enclosing ``with`` block no
        longer ends the span (unless by an exception).
        """
        self._relayed = True
        return sync_relay(self, body)

    def astream(self, body: Any) -> AsyncIterator[bytes]:
        """:meth:`stream` for async bodies: an async iterable, or a streamed ``httpx.Response``
        of an ``AsyncClient``. ``asyncio.CancelledError`` (the server cancelling the task of a
        client that went away) ends the span as ``cancelled``."""
        self._relayed = True
        return async_relay(self, body)

    def set_http_status(self, status: int) -> None:
        """The replica's HTTP status; 4xx/5xx mark the span as an error."""
        try:
            _set_status_code(self._span, int(status))
        except Exception as exc:
            self._decision._error(exc)

    def set_error(self, message: str) -> None:
        """The forward failed (connection refused, timeout...)."""
        try:
            self._span.set_status(Status(StatusCode.ERROR, str(message)))
        except Exception as exc:
            self._decision._error(exc)

    def end(self, exc: BaseException | None = None) -> None:
        """End the forward span (safe to call twice). ``exc``: the forward failed with it
        (``asyncio.CancelledError`` / ``GeneratorExit`` count as a client cancel)."""
        if self._ended:
            return
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            self._end_cancelled()
            return
        self._ended = True
        span = self._span
        try:
            if exc is not None and span.is_recording():
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
            span.end()
        except Exception as e:
            self._decision._error(e)

    # -- internals
    def _first_byte(self) -> None:
        try:
            self._decision._first_byte(time.time_ns())
        except Exception as exc:
            self._decision._error(exc)

    def _end_cancelled(self) -> None:
        """The client went away mid-response: the span ends in error ``cancelled``, and the
        router's server span (if any) records the cancel."""
        if self._ended:
            return
        self._ended = True
        try:
            server = self._decision._server
            if server is not None:
                server.cancelled()
            self._span.set_attribute(sc.ERROR_TYPE, "cancelled")
            self._span.set_status(Status(StatusCode.ERROR, "cancelled: the client went away"))
            self._span.end()
        except Exception as e:
            self._decision._error(e)

    def _add_misuse(self, kind: str) -> None:
        if self._misuse is None:
            self._misuse = []
        self._misuse.append(kind)
        self._span.set_attribute(sc.MISUSE, tuple(self._misuse))

    def _abandon(self, when: str) -> None:
        """Close a forward the router never ended, with an error mark."""
        if self._ended:
            return
        server = self._decision._server
        if server is not None and server._cancelled:
            self._end_cancelled()  # the relay was dropped because the client left
            return
        try:
            self._decision._rec._misused(
                "forward_not_ended",
                f"request {self._decision.request_id!r}: a forward span was never ended (closed "
                f"when {when}); end it, use it as a with block, or relay with stream()/astream()")
            self._add_misuse("forward_not_ended")
            self._span.set_attribute(sc.ERROR_TYPE, "forward_not_ended")
            self._span.set_status(Status(StatusCode.ERROR, f"forward never ended (closed when {when})"))
        except Exception as e:
            self._decision._error(e)
        self._ended = True
        try:
            self._span.end()
        except Exception as e:
            self._decision._error(e)

    def __del__(self) -> None:
        try:
            if not self._ended:
                self._abandon("it was garbage-collected")
        except Exception:  # nothing may escape a finalizer
            pass
