"""Telemetry emission: the simulator hands one :class:`RequestTrace` per finished request to a
:class:`SpanEmitter`. The core is testable with :class:`RecordingEmitter`; :class:`OTelEmitter`
turns traces into routeaudit spans (client, decision + forward, replica) with simulated
timestamps through ``collectors``' after-the-fact APIs.

Virtual time maps to Unix ns as ``t0_ns + int(sim_s * 1e9)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["CandidateTrace", "OTelEmitter", "RecordingEmitter", "RequestTrace", "SpanEmitter"]


class CandidateTrace(NamedTuple):
    """One candidate as the router saw it (fields of ``collectors.router.Candidate``).

    Immutable; a named tuple because eight are built per emitted request."""

    replica: str
    eligible: bool
    excluded_reason: str | None
    waiting: int
    running: int
    kv_usage: float
    remaining_tokens: int
    telemetry_ts_ns: int
    pending: int
    predicted_cached_tokens: int
    est_queue_ms: float
    est_prefill_ms: float
    score: float | None


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """Everything the three sides of one request would report. Times are Unix ns.

    ``status``: ``ok``, ``rejected`` (admission) or ``cancelled`` (client timeout).
    Replica fields are None when the request never reached a replica.
    """

    run_id: str
    request_id: str
    model: str
    router_id: str
    policy: str
    input_tokens: int
    max_tokens: int
    prefix_hashes: tuple[str, ...]
    send_ns: int
    decided_ns: int
    candidates: tuple[CandidateTrace, ...]
    chosen: str | None
    reason: str
    outcome: str
    status: str
    end_ns: int
    first_token_ns: int | None
    output_tokens: int
    finish_reason: str | None
    replica: str | None = None
    replica_arrival_ns: int | None = None
    replica_admit_ns: int | None = None
    replica_first_token_ns: int | None = None
    replica_finish_ns: int | None = None
    cached_tokens: int | None = None
    preemptions: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class SpanEmitter(Protocol):
    """Receives finished requests in finish-time order. Must not raise into the simulator
    (implementations log and count their own failures); ``close`` flushes and is idempotent."""

    def emit(self, trace: RequestTrace) -> None: ...

    def close(self) -> None: ...


class RecordingEmitter:
    """Keeps every trace in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.traces: list[RequestTrace] = []
        self.closed = False

    def emit(self, trace: RequestTrace) -> None:
        self.traces.append(trace)

    def close(self) -> None:
        self.closed = True


from ._otel_emit import OTelEmitter  # noqa: E402  (re-export; imports collectors lazily)
