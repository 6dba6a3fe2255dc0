-- raw_spans: one row per span as received (grain: trace_id, span_id; duplicates ignored).
-- Written only by the collector's writer thread, in batched transactions. The a_* / r_*
-- columns are typed copies of the keys listed in audit/semconv.py (TYPED_SPAN_ATTRIBUTES,
-- TYPED_RESOURCE_ATTRIBUTES). Each span attribute value is stored once: attributes keeps, as
-- JSON text (varchar, not DuckDB's json type: validating every value on insert cost a third of
-- ingest, and the json functions read varchar alike), the attributes no a_* column holds
-- exactly (same kind, no conversion); the view raw_span_attributes gives them all back
-- (docs/semconv.md, "Typed columns"). The candidates JSON of a decision span
-- (routeaudit.decision.candidates) is stored as its rows in raw_span_events, and verbatim in
-- a_decision_candidates where those rows do not hold it whole. Resource attributes are kept
-- whole in resource_attributes. Stores written before 2026-12-02 hold every attribute in
-- attributes.
create table if not exists raw_spans (
    trace_id varchar not null,          -- 32 lowercase hex
    span_id varchar not null,           -- 16 lowercase hex
    parent_span_id varchar,             -- 16 lowercase hex, null for a root
    trace_state varchar,
    name varchar not null,
    kind varchar not null,              -- internal / server / client / producer / consumer
    start_ns bigint not null,           -- Unix ns, emitting host's clock
    end_ns bigint not null,             -- Unix ns, emitting host's clock
    status_code varchar not null,       -- unset / ok / error
    status_message varchar,
    flags bigint,
    scope_name varchar,
    scope_version varchar,
    received_ns bigint not null,        -- Unix ns, collector's clock
    attributes varchar,                    -- span attributes no a_* column holds exactly
    resource_attributes varchar,           -- every resource attribute, verbatim
    links varchar,                         -- [{trace_id, span_id, trace_state, attributes}]
    event_count bigint not null,
    dropped_attributes_count bigint,
    service_name VARCHAR,
    service_instance_id VARCHAR,
    host_name VARCHAR,
    r_replica_id VARCHAR,
    r_router_id VARCHAR,
    r_run_id VARCHAR,
    a_component VARCHAR,
    a_request_id VARCHAR,
    a_attempt BIGINT,
    a_run_id VARCHAR,
    a_model VARCHAR,
    a_max_tokens BIGINT,
    a_input_tokens BIGINT,
    a_stream BOOLEAN,
    a_prefix_hashes VARCHAR[],
    a_endpoint VARCHAR,
    a_router_id VARCHAR,
    a_policy VARCHAR,
    a_chosen VARCHAR,
    a_reason VARCHAR,
    a_decision_outcome VARCHAR,
    a_candidate_count BIGINT,
    a_decision_time_ns BIGINT,
    a_recorder_errors BIGINT,
    a_replica_id VARCHAR,
    a_dp_rank BIGINT,
    a_url_full VARCHAR,
    a_server_address VARCHAR,
    a_server_port BIGINT,
    a_http_status BIGINT,
    a_http_method VARCHAR,
    a_http_route VARCHAR,
    a_url_path VARCHAR,
    a_status VARCHAR,
    a_client_ttft_ms DOUBLE,
    a_client_tpot_ms DOUBLE,
    a_client_e2e_ms DOUBLE,
    a_client_itl_max_ms DOUBLE,
    a_client_cached_tokens BIGINT,
    a_client_error VARCHAR,
    a_gen_ai_request_id VARCHAR,
    a_gen_ai_response_id VARCHAR,
    a_usage_input_tokens BIGINT,
    a_usage_output_tokens BIGINT,
    a_usage_prompt_tokens BIGINT,
    a_usage_completion_tokens BIGINT,
    a_usage_cache_read_tokens BIGINT,
    a_usage_cached_tokens BIGINT,
    a_finish_reasons VARCHAR[],
    a_lat_ttft_s DOUBLE,
    a_lat_e2e_s DOUBLE,
    a_lat_queue_s DOUBLE,
    a_lat_prefill_s DOUBLE,
    a_lat_decode_s DOUBLE,
    a_lat_inference_s DOUBLE,
    a_preemptions BIGINT,
    a_router_request_id VARCHAR,
    a_smg_status_code BIGINT,
    a_smg_latency_us DOUBLE,
    a_smg_uri VARCHAR,
    a_latency_ms DOUBLE,
    a_backend_url VARCHAR,
    a_routing_logic VARCHAR,
    a_rid VARCHAR,
    a_response_model VARCHAR,
    a_method VARCHAR,
    a_http_method_legacy VARCHAR,
    a_http_target VARCHAR,
    a_http_status_legacy BIGINT,
    a_code_namespace VARCHAR,
    a_decision_candidates VARCHAR,      -- verbatim where its raw_span_events rows do not hold it whole, else NULL
    primary key (trace_id, span_id)
);
