"""Plain data records for after-the-fact recording (:meth:`DecisionRecorder.record`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context


@dataclass(slots=True)
class Candidate:
    """One replica the router considered, with the telemetry it saw at decision time.

    Same fields and meaning as the keyword arguments of ``Decision.candidate()``; see
    ``audit.semconv`` (``routeaudit.candidate.*``). ``telemetry_ts_ns`` is on the router's clock
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
