"""Plain data records for after-the-fact recording (:meth:`DecisionRecorder.record`), and
:func:`candidates_of` to read the candidates back from a finished decision span."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import semconv as sc

if TYPE_CHECKING:
    from opentelemetry.context import Context


@dataclass(slots=True)
class Candidate:
    """One replica the router considered, with the telemetry it saw at decision time.

    Same fields and meaning as the keyword arguments of ``Decision.candidate()``; see
    ``semconv`` (``routeaudit.candidate.*``). ``telemetry_ts_ns`` is on the router's clock
    (Unix ns); the recorder computes ``telemetry_age_ms`` from it.
    """

    replica: str
    eligible: bool = True
    excluded_reason: str | None = None
    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None
    remaining_tokens: int | None = None
    telemetry_ts_ns: int | None = None
    pending: int | None = None
    predicted_cached_tokens: int | None = None
    est_queue_ms: float | None = None
    est_prefill_ms: float | None = None
    score: float | None = None
    dp_rank: int | None = None


@dataclass(slots=True)
class DecisionRecord:
    """A complete routing decision recorded after the fact (virtual time, batch routers).

    All ``*_ns`` are Unix ns on the router's clock. ``start_ns``/``end_ns`` bound the decision
    span (default: ``decided_ns``); ``forward_*`` describe the forward span, emitted when
    ``forward_url`` or ``forward_start_ns`` is given (default start: ``decided_ns``, default end:
    its start).
    """

    request_id: str
    decided_ns: int
    candidates: Sequence[Candidate] = field(default_factory=tuple)
    chosen: str | None = None
    reason: str | None = None
    outcome: str = "routed"
    attempt: int = 0
    model: str | None = None
    input_tokens: int | None = None
    max_tokens: int | None = None
    prefix_hashes: Sequence[str] | None = None
    stream: bool | None = None
    endpoint: str | None = None
    parent_context: Context | None = None
    forward_url: str | None = None
    forward_start_ns: int | None = None
    forward_end_ns: int | None = None
    forward_http_status: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None


def candidates_of(span: Any) -> list[dict[str, Any]]:
    """The candidates a finished decision span recorded, in either encoding, as one dict per
    candidate keyed by the full attribute names (``routeaudit.candidate.replica``, ...).

    ``span`` is an SDK ``ReadableSpan`` (e.g. from ``InMemorySpanExporter``): the JSON
    attribute :data:`~semconv.DECISION_CANDIDATES` when present, else the
    :data:`~semconv.EVENT_CANDIDATE` events.
    """
    raw = (span.attributes or {}).get(sc.DECISION_CANDIDATES)
    if raw is None:
        return [dict(e.attributes or {}) for e in span.events if e.name == sc.EVENT_CANDIDATE]
    full = {short: key for key, short in sc.CANDIDATE_JSON_KEYS.items()}
    return [{full.get(k, k): v for k, v in cand.items()} for cand in json.loads(raw)]
