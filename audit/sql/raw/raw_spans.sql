-- raw_spans: one row per span as received (grain: trace_id, span_id; duplicates ignored: the
-- store keeps each stored span's key in routeaudit_span_keys, audit/_span_keys.py: a key on
-- the two varchar ids would make every delete of spans slow).
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
    service_name varchar,
    service_instance_id varchar,
    host_name varchar,
    r_replica_id varchar,
    r_router_id varchar,
    r_run_id varchar,
    a_component varchar,
    a_request_id varchar,
    a_attempt bigint,
    a_run_id varchar,
    a_model varchar,
    a_max_tokens bigint,
    a_input_tokens bigint,
    a_stream boolean,
    a_prefix_hashes varchar[],
    a_endpoint varchar,
    a_router_id varchar,
    a_policy varchar,
    a_chosen varchar,
    a_reason varchar,
    a_decision_outcome varchar,
    a_candidate_count bigint,
    a_decision_time_ns bigint,
    a_recorder_errors bigint,
    a_replica_id varchar,
    a_dp_rank bigint,
    a_url_full varchar,
    a_server_address varchar,
    a_server_port bigint,
    a_http_status bigint,
    a_http_method varchar,
    a_http_route varchar,
    a_url_path varchar,
    a_status varchar,
    a_client_ttft_ms double,
    a_router_ttfb_ms double,
    a_client_tpot_ms double,
    a_client_e2e_ms double,
    a_client_itl_max_ms double,
    a_client_cached_tokens bigint,
    a_client_error varchar,
    a_gen_ai_request_id varchar,
    a_gen_ai_response_id varchar,
    a_usage_input_tokens bigint,
    a_usage_output_tokens bigint,
    a_usage_prompt_tokens bigint,
    a_usage_completion_tokens bigint,
    a_usage_cache_read_tokens bigint,
    a_usage_cached_tokens bigint,
    a_finish_reasons varchar[],
    a_lat_ttft_s double,
    a_lat_e2e_s double,
    a_lat_queue_s double,
    a_lat_prefill_s double,
    a_lat_decode_s double,
    a_lat_inference_s double,
    a_preemptions bigint,
    a_router_request_id varchar,
    a_smg_status_code bigint,
    a_smg_latency_us double,
    a_smg_uri varchar,
    a_latency_ms double,
    a_backend_url varchar,
    a_routing_logic varchar,
    a_rid varchar,
    a_response_model varchar,
    a_method varchar,
    a_http_method_legacy varchar,
    a_http_target varchar,
    a_http_status_legacy bigint,
    a_code_namespace varchar,
    a_decision_candidates varchar       -- verbatim where its raw_span_events rows do not hold it whole, else NULL
);
