"""The routeaudit span attribute convention: the project's public contract.

Every name a routeaudit component emits, and every name a third-party emitter is known to send
(vLLM, SGLang, SMG / sglang-router, vllm-router, vLLM production-stack), is a ``Final`` constant
here with a docstring. ``docs/semconv.md`` mirrors this module; a test keeps the two in step.

Three kinds of span make one request:

* the **client** span (kind CLIENT, ``routeaudit.component = "client"``): the caller's view —
  send time, TTFT, TPOT, output tokens, finish reason, status;
* the **decision** span (kind INTERNAL, name :data:`SPAN_DECISION`) of a router, with one span
  event :data:`EVENT_CANDIDATE` per candidate replica, followed by a **forward** span (kind
  CLIENT, name :data:`SPAN_FORWARD`) that is the parent of the replica's span;
* the **replica** span: vLLM's ``llm_request`` (kind SERVER) with ``gen_ai.*`` attributes, plus
  the facts vLLM leaves out (finish reason, cached tokens) when routeaudit's middleware emits it.

Timestamps inside attributes are Unix epoch nanoseconds on the emitting host's clock; durations
are milliseconds (``*_ms``) unless the emitter's own convention says seconds (vLLM's
``gen_ai.latency.*``). The collector never compares timestamps of different hosts without the
clock-offset correction described in ``docs/clock.md``.

:data:`TYPED_SPAN_ATTRIBUTES`, :data:`TYPED_RESOURCE_ATTRIBUTES` and
:data:`TYPED_EVENT_ATTRIBUTES` say which attribute keys get a typed column in the raw store
(``audit/sql/raw/*.sql``). The decoder fills those columns by coercing the attribute value to the
column's type (a string ``"200"`` into an integer column becomes ``200``; a value that cannot be
coerced leaves the column NULL). Every attribute, typed or not, is also kept verbatim in the raw
JSON columns. Aliases are resolved in SQL (``audit/sql/staging``), never in the decoder.

This package imports nothing but :mod:`typing`, so that instrumentation (a router, a client, a
replica middleware) can use it without pulling in the store (DuckDB, polars).
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "ColumnType", "SPAN_DECISION", "SPAN_FORWARD", "SPAN_CLIENT", "SPAN_VLLM_REQUEST",
    "EVENT_CANDIDATE", "EVENT_FIRST_TOKEN", "EVENT_SMG_SENDING", "COMPONENT", "REQUEST_ID",
    "ATTEMPT", "RUN_ID", "REQUEST_MODEL", "REQUEST_MAX_TOKENS", "REQUEST_INPUT_TOKENS",
    "REQUEST_STREAM", "REQUEST_PREFIX_HASHES", "REQUEST_ENDPOINT", "ROUTER_ID", "ROUTER_POLICY",
    "DECISION_CHOSEN", "DECISION_REASON", "DECISION_OUTCOME", "DECISION_CANDIDATE_COUNT",
    "DECISION_TIME", "DECISION_RECORDER_ERRORS", "DECISION_CANDIDATES", "CANDIDATE_JSON_KEYS",
    "CANDIDATE_REPLICA", "CANDIDATE_ELIGIBLE", "CANDIDATE_EXCLUDED_REASON", "CANDIDATE_CHOSEN",
    "CANDIDATE_WAITING", "CANDIDATE_RUNNING", "CANDIDATE_KV_USAGE",
    "CANDIDATE_REMAINING_TOKENS", "CANDIDATE_TELEMETRY_TS", "CANDIDATE_TELEMETRY_AGE_MS",
    "CANDIDATE_PENDING", "CANDIDATE_PREDICTED_CACHED_TOKENS", "CANDIDATE_EST_QUEUE_MS",
    "CANDIDATE_EST_PREFILL_MS", "CANDIDATE_SCORE", "REPLICA_ID", "REPLICA_DP_RANK", "URL_FULL",
    "SERVER_ADDRESS", "SERVER_PORT", "HTTP_STATUS", "HTTP_METHOD", "HTTP_ROUTE", "URL_PATH",
    "ERROR_TYPE", "ROUTER_TTFB_MS", "MISUSE",
    "STATUS", "CLIENT_TTFT_MS", "CLIENT_TPOT_MS", "CLIENT_E2E_MS", "CLIENT_ITL_MAX_MS",
    "CLIENT_ITL_MS", "CLIENT_CACHED_TOKENS", "CLIENT_ERROR", "GEN_AI_REQUEST_ID",
    "GEN_AI_RESPONSE_ID", "USAGE_INPUT_TOKENS", "USAGE_OUTPUT_TOKENS", "USAGE_PROMPT_TOKENS",
    "USAGE_COMPLETION_TOKENS", "USAGE_CACHE_READ_INPUT_TOKENS", "USAGE_CACHED_TOKENS_ALIAS",
    "RESPONSE_FINISH_REASONS", "LATENCY_TTFT_S", "LATENCY_E2E_S", "LATENCY_QUEUE_S",
    "LATENCY_PREFILL_S", "LATENCY_DECODE_S", "LATENCY_INFERENCE_S", "REPLICA_PREEMPTIONS",
    "SMG_REQUEST_ID", "SMG_STATUS_CODE", "SMG_LATENCY", "SMG_URI", "SMG_EVENT_URL",
    "VLLM_ROUTER_LATENCY_MS", "PRODSTACK_BACKEND_URL", "PRODSTACK_ROUTING_LOGIC", "SGLANG_RID",
    "SMG_METHOD", "SMG_WORKER_URL", "SMG_WORKER", "CODE_NAMESPACE", "HTTP_METHOD_LEGACY",
    "HTTP_TARGET_LEGACY", "HTTP_STATUS_LEGACY", "RESPONSE_MODEL", "SERVICE_NAME",
    "SERVICE_INSTANCE_ID", "HOST_NAME", "TYPED_SPAN_ATTRIBUTES", "TYPED_RESOURCE_ATTRIBUTES",
    "TYPED_EVENT_ATTRIBUTES", "METRIC_ALIASES", "METRIC_DP_RANK_LABELS",
]

ColumnType = Literal["VARCHAR", "BIGINT", "DOUBLE", "BOOLEAN", "VARCHAR[]", "BIGINT[]", "DOUBLE[]"]

# --------------------------------------------------------------------------------------------
# Span and event names
# --------------------------------------------------------------------------------------------
SPAN_DECISION: Final = "routeaudit.decision"
"""A router's routing decision for one attempt of one request (kind INTERNAL)."""

SPAN_FORWARD: Final = "routeaudit.forward"
"""The router's call to the chosen replica (kind CLIENT), child of the decision span."""

SPAN_CLIENT: Final = "routeaudit.client"
"""The instrumented client's request (kind CLIENT), the root of the request's trace."""

SPAN_VLLM_REQUEST: Final = "llm_request"
"""vLLM's per-request span (kind SERVER); routeaudit's replica middleware emits the same name."""

EVENT_CANDIDATE: Final = "routeaudit.candidate"
"""Span event on a decision span: one per candidate replica the router considered."""

EVENT_FIRST_TOKEN: Final = "routeaudit.first_token"
"""Span event on a client or replica span at the moment the first output token was seen."""

EVENT_SMG_SENDING: Final = "Sending request"
"""SMG's span event naming the chosen worker in its ``url`` attribute."""

# --------------------------------------------------------------------------------------------
# Component and request identity
# --------------------------------------------------------------------------------------------
COMPONENT: Final = "routeaudit.component"
"""Which side emitted the span: ``"client"``, ``"router"`` or ``"replica"``."""

REQUEST_ID: Final = "routeaudit.request.id"
"""The logical request id, equal to the ``X-Request-Id`` header the client sends."""

ATTEMPT: Final = "routeaudit.attempt"
"""Attempt number of this request at the router, 0 for the first; retries count up."""

RUN_ID: Final = "routeaudit.run.id"
"""Resource attribute naming one experiment run (testbed, load generator): policies are compared
run against run on the same arrival trace."""

# --------------------------------------------------------------------------------------------
# Request facts (set on client and decision spans)
# --------------------------------------------------------------------------------------------
REQUEST_MODEL: Final = "gen_ai.request.model"
"""Model name requested (OTel GenAI semantic convention)."""

REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
"""Upper bound on output tokens (OTel GenAI; vLLM sets it too)."""

REQUEST_INPUT_TOKENS: Final = "routeaudit.request.input_tokens"
"""Prompt length in tokens as known to the router/client at decision time."""

REQUEST_STREAM: Final = "routeaudit.request.stream"
"""Whether the response is streamed (SSE)."""

REQUEST_PREFIX_HASHES: Final = "routeaudit.request.prefix_hashes"
"""Chained prefix block hashes of the prompt (string array); no prompt text is ever stored."""

REQUEST_ENDPOINT: Final = "routeaudit.request.endpoint"
"""API path called, e.g. ``/v1/chat/completions``."""

# --------------------------------------------------------------------------------------------
# Router decision (decision span)
# --------------------------------------------------------------------------------------------
ROUTER_ID: Final = "routeaudit.router.id"
"""Router instance id (several independent routers may serve one fleet: herding)."""

ROUTER_POLICY: Final = "routeaudit.router.policy"
"""Policy name, e.g. ``round_robin``, ``cache_aware``, ``power_of_two``, ``qp_cost``."""

DECISION_CHOSEN: Final = "routeaudit.decision.chosen"
"""Replica id the router chose; absent when no replica was chosen (rejected)."""

DECISION_REASON: Final = "routeaudit.decision.reason"
"""Why: e.g. ``cache_affinity``, ``least_load``, ``round_robin``, ``no_eligible_replica``."""

DECISION_OUTCOME: Final = "routeaudit.decision.outcome"
"""``routed``, ``rejected`` (admission limit), ``queued`` or ``error``."""

DECISION_CANDIDATE_COUNT: Final = "routeaudit.decision.candidate_count"
"""Number of candidate events on this decision span."""

DECISION_TIME: Final = "routeaudit.decision.time_ns"
"""Decision instant (router clock, Unix ns); defaults to the span start when absent."""

DECISION_RECORDER_ERRORS: Final = "routeaudit.decision.recorder_errors"
"""Count of recorder errors swallowed while recording this decision (the router went on)."""

DECISION_CANDIDATES: Final = "routeaudit.decision.candidates"
"""The candidates of this decision in one string attribute (the compact encoding, the
recorder's default; the alternative is one :data:`EVENT_CANDIDATE` event per candidate): a JSON
array with one object per candidate, in the order they were considered. Object keys are the
candidate attribute names without the ``routeaudit.candidate.`` prefix (see
:data:`CANDIDATE_JSON_KEYS`) plus ``dp_rank``; keys whose value is unknown are omitted; numbers are
JSON numbers, booleans JSON booleans (a non-finite number is ``null``). The candidates' time is
the decision time (:data:`DECISION_TIME`)."""

CANDIDATE_JSON_KEYS: Final[dict[str, str]] = {
    "routeaudit.candidate.replica": "replica",
    "routeaudit.candidate.eligible": "eligible",
    "routeaudit.candidate.excluded_reason": "excluded_reason",
    "routeaudit.candidate.chosen": "chosen",
    "routeaudit.candidate.waiting": "waiting",
    "routeaudit.candidate.running": "running",
    "routeaudit.candidate.kv_usage": "kv_usage",
    "routeaudit.candidate.remaining_tokens": "remaining_tokens",
    "routeaudit.candidate.telemetry_ts_ns": "telemetry_ts_ns",
    "routeaudit.candidate.telemetry_age_ms": "telemetry_age_ms",
    "routeaudit.candidate.pending": "pending",
    "routeaudit.candidate.predicted_cached_tokens": "predicted_cached_tokens",
    "routeaudit.candidate.est_queue_ms": "est_queue_ms",
    "routeaudit.candidate.est_prefill_ms": "est_prefill_ms",
    "routeaudit.candidate.score": "score",
    "routeaudit.replica.dp_rank": "dp_rank",
}
"""Candidate attribute key (of a :data:`EVENT_CANDIDATE` event) -> key of the same fact in the
objects of :data:`DECISION_CANDIDATES`."""

# --------------------------------------------------------------------------------------------
# Candidate (attributes of EVENT_CANDIDATE)
# --------------------------------------------------------------------------------------------
CANDIDATE_REPLICA: Final = "routeaudit.candidate.replica"
"""Replica id of the candidate (URL, host:port or name; normalised in staging)."""

CANDIDATE_ELIGIBLE: Final = "routeaudit.candidate.eligible"
"""Whether the replica could take the request (healthy, compatible, admitted)."""

CANDIDATE_EXCLUDED_REASON: Final = "routeaudit.candidate.excluded_reason"
"""Why an ineligible candidate was excluded: ``unhealthy``, ``incompatible``, ``full``..."""

CANDIDATE_CHOSEN: Final = "routeaudit.candidate.chosen"
"""True on the candidate the router chose."""

CANDIDATE_WAITING: Final = "routeaudit.candidate.waiting"
"""Waiting (queued) requests the router saw in its telemetry."""

CANDIDATE_RUNNING: Final = "routeaudit.candidate.running"
"""Running requests the router saw in its telemetry."""

CANDIDATE_KV_USAGE: Final = "routeaudit.candidate.kv_usage"
"""KV-cache usage fraction 0..1 the router saw."""

CANDIDATE_REMAINING_TOKENS: Final = "routeaudit.candidate.remaining_tokens"
"""Remaining work the router estimated on the replica, in tokens (prefill still to do plus
decode expected): count work, not requests."""

CANDIDATE_TELEMETRY_TS: Final = "routeaudit.candidate.telemetry_ts_ns"
"""When the telemetry the router used was sampled (router clock, Unix ns)."""

CANDIDATE_TELEMETRY_AGE_MS: Final = "routeaudit.candidate.telemetry_age_ms"
"""Age of that telemetry at decision time, ms (decision time minus telemetry_ts)."""

CANDIDATE_PENDING: Final = "routeaudit.candidate.pending"
"""Assignments this router sent to the replica after the telemetry sample it used was taken, so
not yet counted in it. A fact, whatever the policy: a router with pending correction adds them to
the load it weighs; one without still sends the count when it tracks it. A router that does not
know leaves the attribute out (unknown), never 0 (0 says nothing was outstanding)."""

CANDIDATE_PREDICTED_CACHED_TOKENS: Final = "routeaudit.candidate.predicted_cached_tokens"
"""Prompt tokens the router predicted this replica had cached (its own prefix view)."""

CANDIDATE_EST_QUEUE_MS: Final = "routeaudit.candidate.est_queue_ms"
"""Router's estimate of the wait before the request gets processed (Q of Q+P)."""

CANDIDATE_EST_PREFILL_MS: Final = "routeaudit.candidate.est_prefill_ms"
"""Router's estimate of processing until the first token (P of Q+P)."""

CANDIDATE_SCORE: Final = "routeaudit.candidate.score"
"""The policy's score for this candidate (lower or higher is better per policy; see docs)."""

# --------------------------------------------------------------------------------------------
# Forward span (router → replica)
# --------------------------------------------------------------------------------------------
REPLICA_ID: Final = "routeaudit.replica.id"
"""Replica id: on a forward span the target, on a replica span or resource the replica itself."""

REPLICA_DP_RANK: Final = "routeaudit.replica.dp_rank"
"""DP rank inside a replica process that runs several engines (vLLM ``engine``, SGLang
``dp_rank``)."""

URL_FULL: Final = "url.full"
"""Target URL (OTel HTTP convention); vllm-router's CLIENT span carries the chosen worker here."""

SERVER_ADDRESS: Final = "server.address"
"""Target host (OTel)."""

SERVER_PORT: Final = "server.port"
"""Target port (OTel; vllm-router sends it as a string)."""

HTTP_STATUS: Final = "http.response.status_code"
"""HTTP status (OTel; some emitters send a string)."""

HTTP_METHOD: Final = "http.request.method"
"""HTTP method (OTel)."""

HTTP_ROUTE: Final = "http.route"
"""Route template (OTel)."""

URL_PATH: Final = "url.path"
"""Request path (OTel)."""

ERROR_TYPE: Final = "error.type"
"""Why a span ended in error (OTel): the exception's qualified type name, ``cancelled`` when the
client went away mid-response, ``forward_not_ended`` for a forward span the router never ended
(closed by the recorder)."""

ROUTER_TTFB_MS: Final = "routeaudit.router.ttfb_ms"
"""On the router's own SERVER span (or, without one, its decision span): ms from the span's start
to the first response body byte the router sent its client, router clock. For a streamed
completion this is the router-side TTFT; for a non-streamed one, the whole answer's time."""

MISUSE: Final = "routeaudit.misuse"
"""Instrumentation mistakes the recorder caught and survived on this decision or forward span
(string array): ``decided_after_end``, ``chosen_not_candidate``, ``none_replica``,
``forward_not_ended``, ``respond_without_span``. Each is also counted in the recorder's
``errors``."""

# --------------------------------------------------------------------------------------------
# Client outcome (client span)
# --------------------------------------------------------------------------------------------
STATUS: Final = "routeaudit.status"
"""Outcome: ``ok``, ``error``, ``timeout``, ``cancelled`` or ``rejected``."""

CLIENT_TTFT_MS: Final = "routeaudit.client.ttft_ms"
"""Client-observed time to first token, ms (client clock)."""

CLIENT_TPOT_MS: Final = "routeaudit.client.tpot_ms"
"""Per-request mean time per output token excluding the first, ms: (e2e − ttft)/(n − 1);
absent when fewer than 2 tokens were produced."""

CLIENT_E2E_MS: Final = "routeaudit.client.e2e_ms"
"""Client-observed end-to-end latency, ms."""

CLIENT_ITL_MAX_MS: Final = "routeaudit.client.itl_max_ms"
"""Largest inter-token gap seen by the client, ms (a stall TPOT averages away)."""

CLIENT_ITL_MS: Final = "routeaudit.client.itl_ms"
"""All inter-token gaps, ms (double array; capped at 4096 values)."""

CLIENT_CACHED_TOKENS: Final = "routeaudit.client.cached_tokens"
"""``usage.prompt_tokens_details.cached_tokens`` as returned by the server."""

CLIENT_ERROR: Final = "routeaudit.client.error"
"""Short error text when status is not ok."""

# --------------------------------------------------------------------------------------------
# GenAI / vLLM replica span
# --------------------------------------------------------------------------------------------
GEN_AI_REQUEST_ID: Final = "gen_ai.request.id"
"""vLLM's request id: ``cmpl-<X-Request-Id>-0`` or ``chatcmpl-<X-Request-Id>``."""

GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
"""OTel GenAI response id."""

USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
"""Prompt tokens (current OTel GenAI name)."""

USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
"""Output tokens (current OTel GenAI name)."""

USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
"""Alias of input tokens: older GenAI name, still emitted by vLLM."""

USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
"""Alias of output tokens: older GenAI name, still emitted by vLLM."""

USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
"""Prompt tokens served from the prefix cache (actual cached tokens at the replica)."""

USAGE_CACHED_TOKENS_ALIAS: Final = "gen_ai.usage.cached_tokens"
"""Alias of cached tokens seen in some emitters."""

RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
"""Finish reasons (string array): ``stop``, ``length``, ``abort``..."""

LATENCY_TTFT_S: Final = "gen_ai.latency.time_to_first_token"
"""vLLM: time to first token on the engine's clock, seconds."""

LATENCY_E2E_S: Final = "gen_ai.latency.e2e"
"""vLLM: engine end-to-end, seconds."""

LATENCY_QUEUE_S: Final = "gen_ai.latency.time_in_queue"
"""vLLM: time waiting in the scheduler queue, seconds."""

LATENCY_PREFILL_S: Final = "gen_ai.latency.time_in_model_prefill"
"""vLLM: time in prefill, seconds."""

LATENCY_DECODE_S: Final = "gen_ai.latency.time_in_model_decode"
"""vLLM: time in decode, seconds."""

LATENCY_INFERENCE_S: Final = "gen_ai.latency.time_in_model_inference"
"""vLLM: prefill + decode, seconds."""

REPLICA_PREEMPTIONS: Final = "routeaudit.replica.preemptions"
"""Times the request was preempted on the replica (KV pool exhausted)."""

# --------------------------------------------------------------------------------------------
# Third-party router dialects
# --------------------------------------------------------------------------------------------
SMG_REQUEST_ID: Final = "request_id"
"""SMG / vllm-router: the request id (the client's ``x-request-id`` or a generated one)."""

SMG_STATUS_CODE: Final = "status_code"
"""SMG: HTTP status as a string."""

SMG_LATENCY: Final = "latency"
"""SMG: latency as a string, microseconds."""

SMG_URI: Final = "uri"
"""SMG: request path."""

SMG_EVENT_URL: Final = "url"
"""SMG ``Sending request`` event: the chosen worker's base URL."""

VLLM_ROUTER_LATENCY_MS: Final = "latency_ms"
"""vllm-router SERVER span: latency, ms."""

PRODSTACK_BACKEND_URL: Final = "vllm.backend_url"
"""vLLM production-stack router: the chosen backend URL."""

PRODSTACK_ROUTING_LOGIC: Final = "vllm.routing_logic"
"""vLLM production-stack router: the routing policy."""

SGLANG_RID: Final = "rid"
"""SGLang request spans: the request id."""

SMG_METHOD: Final = "method"
"""SMG server spans: the HTTP method."""

SMG_WORKER_URL: Final = "worker_url"
"""SMG events: the worker a request was sent to (older releases; newer ones send ``url``)."""

SMG_WORKER: Final = "worker"
"""SMG events: the worker a request was sent to (some releases)."""

CODE_NAMESPACE: Final = "code.namespace"
"""Rust tracing spans (SMG, vllm-router): the module that emitted them; tells the dialect."""

# Older OTel HTTP conventions, still emitted by some routers and engines.
HTTP_METHOD_LEGACY: Final = "http.method"
HTTP_TARGET_LEGACY: Final = "http.target"
HTTP_STATUS_LEGACY: Final = "http.status_code"

RESPONSE_MODEL: Final = "gen_ai.response.model"
"""GenAI: the model that answered (when the request named none)."""

# --------------------------------------------------------------------------------------------
# Resource attributes
# --------------------------------------------------------------------------------------------
SERVICE_NAME: Final = "service.name"
"""OTel resource: service name."""

SERVICE_INSTANCE_ID: Final = "service.instance.id"
"""OTel resource: instance id (a replica or router instance)."""

HOST_NAME: Final = "host.name"
"""OTel resource: host; spans of one host share one clock (see docs/clock.md)."""

# --------------------------------------------------------------------------------------------
# Typed columns in the raw store: attribute key -> (column name, column type)
# --------------------------------------------------------------------------------------------
TYPED_SPAN_ATTRIBUTES: Final[dict[str, tuple[str, ColumnType]]] = {
    COMPONENT: ("a_component", "VARCHAR"),
    REQUEST_ID: ("a_request_id", "VARCHAR"),
    ATTEMPT: ("a_attempt", "BIGINT"),
    RUN_ID: ("a_run_id", "VARCHAR"),
    REQUEST_MODEL: ("a_model", "VARCHAR"),
    REQUEST_MAX_TOKENS: ("a_max_tokens", "BIGINT"),
    REQUEST_INPUT_TOKENS: ("a_input_tokens", "BIGINT"),
    REQUEST_STREAM: ("a_stream", "BOOLEAN"),
    REQUEST_PREFIX_HASHES: ("a_prefix_hashes", "VARCHAR[]"),
    REQUEST_ENDPOINT: ("a_endpoint", "VARCHAR"),
    ROUTER_ID: ("a_router_id", "VARCHAR"),
    ROUTER_POLICY: ("a_policy", "VARCHAR"),
    DECISION_CHOSEN: ("a_chosen", "VARCHAR"),
    DECISION_REASON: ("a_reason", "VARCHAR"),
    DECISION_OUTCOME: ("a_decision_outcome", "VARCHAR"),
    DECISION_CANDIDATE_COUNT: ("a_candidate_count", "BIGINT"),
    DECISION_TIME: ("a_decision_time_ns", "BIGINT"),
    DECISION_RECORDER_ERRORS: ("a_recorder_errors", "BIGINT"),
    REPLICA_ID: ("a_replica_id", "VARCHAR"),
    REPLICA_DP_RANK: ("a_dp_rank", "BIGINT"),
    URL_FULL: ("a_url_full", "VARCHAR"),
    SERVER_ADDRESS: ("a_server_address", "VARCHAR"),
    SERVER_PORT: ("a_server_port", "BIGINT"),
    HTTP_STATUS: ("a_http_status", "BIGINT"),
    HTTP_METHOD: ("a_http_method", "VARCHAR"),
    HTTP_ROUTE: ("a_http_route", "VARCHAR"),
    URL_PATH: ("a_url_path", "VARCHAR"),
    STATUS: ("a_status", "VARCHAR"),
    CLIENT_TTFT_MS: ("a_client_ttft_ms", "DOUBLE"),
    ROUTER_TTFB_MS: ("a_router_ttfb_ms", "DOUBLE"),
    CLIENT_TPOT_MS: ("a_client_tpot_ms", "DOUBLE"),
    CLIENT_E2E_MS: ("a_client_e2e_ms", "DOUBLE"),
    CLIENT_ITL_MAX_MS: ("a_client_itl_max_ms", "DOUBLE"),
    CLIENT_CACHED_TOKENS: ("a_client_cached_tokens", "BIGINT"),
    CLIENT_ERROR: ("a_client_error", "VARCHAR"),
    GEN_AI_REQUEST_ID: ("a_gen_ai_request_id", "VARCHAR"),
    GEN_AI_RESPONSE_ID: ("a_gen_ai_response_id", "VARCHAR"),
    USAGE_INPUT_TOKENS: ("a_usage_input_tokens", "BIGINT"),
    USAGE_OUTPUT_TOKENS: ("a_usage_output_tokens", "BIGINT"),
    USAGE_PROMPT_TOKENS: ("a_usage_prompt_tokens", "BIGINT"),
    USAGE_COMPLETION_TOKENS: ("a_usage_completion_tokens", "BIGINT"),
    USAGE_CACHE_READ_INPUT_TOKENS: ("a_usage_cache_read_tokens", "BIGINT"),
    USAGE_CACHED_TOKENS_ALIAS: ("a_usage_cached_tokens", "BIGINT"),
    RESPONSE_FINISH_REASONS: ("a_finish_reasons", "VARCHAR[]"),
    LATENCY_TTFT_S: ("a_lat_ttft_s", "DOUBLE"),
    LATENCY_E2E_S: ("a_lat_e2e_s", "DOUBLE"),
    LATENCY_QUEUE_S: ("a_lat_queue_s", "DOUBLE"),
    LATENCY_PREFILL_S: ("a_lat_prefill_s", "DOUBLE"),
    LATENCY_DECODE_S: ("a_lat_decode_s", "DOUBLE"),
    LATENCY_INFERENCE_S: ("a_lat_inference_s", "DOUBLE"),
    REPLICA_PREEMPTIONS: ("a_preemptions", "BIGINT"),
    SMG_REQUEST_ID: ("a_router_request_id", "VARCHAR"),
    SMG_STATUS_CODE: ("a_smg_status_code", "BIGINT"),
    SMG_LATENCY: ("a_smg_latency_us", "DOUBLE"),
    SMG_URI: ("a_smg_uri", "VARCHAR"),
    VLLM_ROUTER_LATENCY_MS: ("a_latency_ms", "DOUBLE"),
    PRODSTACK_BACKEND_URL: ("a_backend_url", "VARCHAR"),
    PRODSTACK_ROUTING_LOGIC: ("a_routing_logic", "VARCHAR"),
    SGLANG_RID: ("a_rid", "VARCHAR"),
    # read by staging; typed so that normalisation never parses the attributes JSON
    RESPONSE_MODEL: ("a_response_model", "VARCHAR"),
    SMG_METHOD: ("a_method", "VARCHAR"),
    HTTP_METHOD_LEGACY: ("a_http_method_legacy", "VARCHAR"),
    HTTP_TARGET_LEGACY: ("a_http_target", "VARCHAR"),
    HTTP_STATUS_LEGACY: ("a_http_status_legacy", "BIGINT"),
    CODE_NAMESPACE: ("a_code_namespace", "VARCHAR"),
    DECISION_CANDIDATES: ("a_decision_candidates", "VARCHAR"),
}
"""Span attributes that get a typed column in ``raw_spans``; a value its column holds exactly is
left out of the ``attributes`` JSON (the view ``raw_span_attributes`` has them all)."""

TYPED_RESOURCE_ATTRIBUTES: Final[dict[str, tuple[str, ColumnType]]] = {
    SERVICE_NAME: ("service_name", "VARCHAR"),
    SERVICE_INSTANCE_ID: ("service_instance_id", "VARCHAR"),
    HOST_NAME: ("host_name", "VARCHAR"),
    REPLICA_ID: ("r_replica_id", "VARCHAR"),
    ROUTER_ID: ("r_router_id", "VARCHAR"),
    RUN_ID: ("r_run_id", "VARCHAR"),
}
"""Resource attributes that get a typed column in ``raw_spans``."""

TYPED_EVENT_ATTRIBUTES: Final[dict[str, tuple[str, ColumnType]]] = {
    CANDIDATE_REPLICA: ("c_replica", "VARCHAR"),
    CANDIDATE_ELIGIBLE: ("c_eligible", "BOOLEAN"),
    CANDIDATE_EXCLUDED_REASON: ("c_excluded_reason", "VARCHAR"),
    CANDIDATE_CHOSEN: ("c_chosen", "BOOLEAN"),
    CANDIDATE_WAITING: ("c_waiting", "BIGINT"),
    CANDIDATE_RUNNING: ("c_running", "BIGINT"),
    CANDIDATE_KV_USAGE: ("c_kv_usage", "DOUBLE"),
    CANDIDATE_REMAINING_TOKENS: ("c_remaining_tokens", "BIGINT"),
    CANDIDATE_TELEMETRY_TS: ("c_telemetry_ts_ns", "BIGINT"),
    CANDIDATE_TELEMETRY_AGE_MS: ("c_telemetry_age_ms", "DOUBLE"),
    CANDIDATE_PENDING: ("c_pending", "BIGINT"),
    CANDIDATE_PREDICTED_CACHED_TOKENS: ("c_predicted_cached_tokens", "BIGINT"),
    CANDIDATE_EST_QUEUE_MS: ("c_est_queue_ms", "DOUBLE"),
    CANDIDATE_EST_PREFILL_MS: ("c_est_prefill_ms", "DOUBLE"),
    CANDIDATE_SCORE: ("c_score", "DOUBLE"),
    SMG_EVENT_URL: ("e_url", "VARCHAR"),
    SMG_WORKER_URL: ("e_worker_url", "VARCHAR"),
    SMG_WORKER: ("e_worker", "VARCHAR"),
    REPLICA_DP_RANK: ("c_dp_rank", "BIGINT"),
}
"""Span-event attributes that get a typed column in ``raw_span_events``."""

# --------------------------------------------------------------------------------------------
# Metric names the scraper understands (snapshots)
# --------------------------------------------------------------------------------------------
METRIC_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
    "cache_hit_rate": ("sglang:cache_hit_rate",),
}
"""Snapshot field -> metric names that carry it (first match wins). DP-rank labels: vLLM
``engine``, SGLang ``dp_rank``."""

METRIC_DP_RANK_LABELS: Final = ("engine", "dp_rank")
"""Prometheus labels that name the DP rank of an engine inside one replica process."""
