-- raw_span_attributes: every attribute of a span as one JSON object (grain: trace_id, span_id),
-- as the emitter sent it (after the collector's limits: prompt keys dropped, long strings cut).
-- raw_spans.attributes holds only what its typed a_* columns do not hold exactly (same kind, no
-- conversion: a string in a VARCHAR column, an int in a BIGINT one, every element of a list):
-- storing each value once made ingest faster (docs/performance.md). This view puts the typed
-- values back; an attribute that is in raw_spans.attributes (a store written before that change
-- keeps them all there) is taken from it as stored. Key order is not kept, and the decision
-- candidates text appears here only where raw_spans keeps it verbatim (a_decision_candidates):
-- elsewhere its rows are in raw_span_events. Always a view (audit/_relations.py, ALWAYS_VIEWS):
-- no relation reads it, and a table would copy every span's attributes at each refresh. The
-- keys are those of TYPED_SPAN_ATTRIBUTES in audit/semconv.py (tests/audit/test_raw_span_attributes.py
-- checks they match).
with

stored as (
    select
        *,
        json_keys(coalesce(attributes, '{}')) as stored_keys
    from raw_spans
),

final as (
    select
        trace_id,
        span_id,
        -- the typed values not already stored (the inner patch drops their NULLs) patched onto
        -- the stored object, so a stored key, null or not, stays as it is
        -- noqa: disable=LT05
        -- one attribute a line, key beside its column: tests/audit/test_raw_span_attributes.py
        -- reads the pairs line by line to check them against audit/semconv.py
        json_merge_patch(coalesce(attributes, '{}'), json_merge_patch('{}', json_object(
            'routeaudit.component', if(list_contains(stored_keys, 'routeaudit.component'), null, a_component),
            'routeaudit.request.id', if(list_contains(stored_keys, 'routeaudit.request.id'), null, a_request_id),
            'routeaudit.attempt', if(list_contains(stored_keys, 'routeaudit.attempt'), null, a_attempt),
            'routeaudit.run.id', if(list_contains(stored_keys, 'routeaudit.run.id'), null, a_run_id),
            'gen_ai.request.model', if(list_contains(stored_keys, 'gen_ai.request.model'), null, a_model),
            'gen_ai.request.max_tokens', if(list_contains(stored_keys, 'gen_ai.request.max_tokens'), null, a_max_tokens),
            'routeaudit.request.input_tokens', if(list_contains(stored_keys, 'routeaudit.request.input_tokens'), null, a_input_tokens),
            'routeaudit.request.stream', if(list_contains(stored_keys, 'routeaudit.request.stream'), null, a_stream),
            'routeaudit.request.prefix_hashes', if(list_contains(stored_keys, 'routeaudit.request.prefix_hashes'), null, a_prefix_hashes),
            'routeaudit.request.endpoint', if(list_contains(stored_keys, 'routeaudit.request.endpoint'), null, a_endpoint),
            'routeaudit.router.id', if(list_contains(stored_keys, 'routeaudit.router.id'), null, a_router_id),
            'routeaudit.router.policy', if(list_contains(stored_keys, 'routeaudit.router.policy'), null, a_policy),
            'routeaudit.decision.chosen', if(list_contains(stored_keys, 'routeaudit.decision.chosen'), null, a_chosen),
            'routeaudit.decision.reason', if(list_contains(stored_keys, 'routeaudit.decision.reason'), null, a_reason),
            'routeaudit.decision.outcome', if(list_contains(stored_keys, 'routeaudit.decision.outcome'), null, a_decision_outcome),
            'routeaudit.decision.candidate_count', if(list_contains(stored_keys, 'routeaudit.decision.candidate_count'), null, a_candidate_count),
            'routeaudit.decision.time_ns', if(list_contains(stored_keys, 'routeaudit.decision.time_ns'), null, a_decision_time_ns),
            'routeaudit.decision.recorder_errors', if(list_contains(stored_keys, 'routeaudit.decision.recorder_errors'), null, a_recorder_errors),
            'routeaudit.replica.id', if(list_contains(stored_keys, 'routeaudit.replica.id'), null, a_replica_id),
            'routeaudit.replica.dp_rank', if(list_contains(stored_keys, 'routeaudit.replica.dp_rank'), null, a_dp_rank),
            'url.full', if(list_contains(stored_keys, 'url.full'), null, a_url_full),
            'server.address', if(list_contains(stored_keys, 'server.address'), null, a_server_address),
            'server.port', if(list_contains(stored_keys, 'server.port'), null, a_server_port),
            'http.response.status_code', if(list_contains(stored_keys, 'http.response.status_code'), null, a_http_status),
            'http.request.method', if(list_contains(stored_keys, 'http.request.method'), null, a_http_method),
            'http.route', if(list_contains(stored_keys, 'http.route'), null, a_http_route),
            'url.path', if(list_contains(stored_keys, 'url.path'), null, a_url_path),
            'routeaudit.status', if(list_contains(stored_keys, 'routeaudit.status'), null, a_status),
            'routeaudit.client.ttft_ms', if(list_contains(stored_keys, 'routeaudit.client.ttft_ms'), null, a_client_ttft_ms),
            'routeaudit.router.ttfb_ms', if(list_contains(stored_keys, 'routeaudit.router.ttfb_ms'), null, a_router_ttfb_ms),
            'routeaudit.client.tpot_ms', if(list_contains(stored_keys, 'routeaudit.client.tpot_ms'), null, a_client_tpot_ms),
            'routeaudit.client.e2e_ms', if(list_contains(stored_keys, 'routeaudit.client.e2e_ms'), null, a_client_e2e_ms),
            'routeaudit.client.itl_max_ms', if(list_contains(stored_keys, 'routeaudit.client.itl_max_ms'), null, a_client_itl_max_ms),
            'routeaudit.client.cached_tokens', if(list_contains(stored_keys, 'routeaudit.client.cached_tokens'), null, a_client_cached_tokens),
            'routeaudit.client.error', if(list_contains(stored_keys, 'routeaudit.client.error'), null, a_client_error),
            'gen_ai.request.id', if(list_contains(stored_keys, 'gen_ai.request.id'), null, a_gen_ai_request_id),
            'gen_ai.response.id', if(list_contains(stored_keys, 'gen_ai.response.id'), null, a_gen_ai_response_id),
            'gen_ai.usage.input_tokens', if(list_contains(stored_keys, 'gen_ai.usage.input_tokens'), null, a_usage_input_tokens),
            'gen_ai.usage.output_tokens', if(list_contains(stored_keys, 'gen_ai.usage.output_tokens'), null, a_usage_output_tokens),
            'gen_ai.usage.prompt_tokens', if(list_contains(stored_keys, 'gen_ai.usage.prompt_tokens'), null, a_usage_prompt_tokens),
            'gen_ai.usage.completion_tokens', if(list_contains(stored_keys, 'gen_ai.usage.completion_tokens'), null, a_usage_completion_tokens),
            'gen_ai.usage.cache_read.input_tokens', if(list_contains(stored_keys, 'gen_ai.usage.cache_read.input_tokens'), null, a_usage_cache_read_tokens),
            'gen_ai.usage.cached_tokens', if(list_contains(stored_keys, 'gen_ai.usage.cached_tokens'), null, a_usage_cached_tokens),
            'gen_ai.response.finish_reasons', if(list_contains(stored_keys, 'gen_ai.response.finish_reasons'), null, a_finish_reasons),
            'gen_ai.latency.time_to_first_token', if(list_contains(stored_keys, 'gen_ai.latency.time_to_first_token'), null, a_lat_ttft_s),
            'gen_ai.latency.e2e', if(list_contains(stored_keys, 'gen_ai.latency.e2e'), null, a_lat_e2e_s),
            'gen_ai.latency.time_in_queue', if(list_contains(stored_keys, 'gen_ai.latency.time_in_queue'), null, a_lat_queue_s),
            'gen_ai.latency.time_in_model_prefill', if(list_contains(stored_keys, 'gen_ai.latency.time_in_model_prefill'), null, a_lat_prefill_s),
            'gen_ai.latency.time_in_model_decode', if(list_contains(stored_keys, 'gen_ai.latency.time_in_model_decode'), null, a_lat_decode_s),
            'gen_ai.latency.time_in_model_inference', if(list_contains(stored_keys, 'gen_ai.latency.time_in_model_inference'), null, a_lat_inference_s),
            'routeaudit.replica.preemptions', if(list_contains(stored_keys, 'routeaudit.replica.preemptions'), null, a_preemptions),
            'request_id', if(list_contains(stored_keys, 'request_id'), null, a_router_request_id),
            'status_code', if(list_contains(stored_keys, 'status_code'), null, a_smg_status_code),
            'latency', if(list_contains(stored_keys, 'latency'), null, a_smg_latency_us),
            'uri', if(list_contains(stored_keys, 'uri'), null, a_smg_uri),
            'latency_ms', if(list_contains(stored_keys, 'latency_ms'), null, a_latency_ms),
            'vllm.backend_url', if(list_contains(stored_keys, 'vllm.backend_url'), null, a_backend_url),
            'vllm.routing_logic', if(list_contains(stored_keys, 'vllm.routing_logic'), null, a_routing_logic),
            'rid', if(list_contains(stored_keys, 'rid'), null, a_rid),
            'gen_ai.response.model', if(list_contains(stored_keys, 'gen_ai.response.model'), null, a_response_model),
            'method', if(list_contains(stored_keys, 'method'), null, a_method),
            'http.method', if(list_contains(stored_keys, 'http.method'), null, a_http_method_legacy),
            'http.target', if(list_contains(stored_keys, 'http.target'), null, a_http_target),
            'http.status_code', if(list_contains(stored_keys, 'http.status_code'), null, a_http_status_legacy),
            'code.namespace', if(list_contains(stored_keys, 'code.namespace'), null, a_code_namespace),
            'routeaudit.decision.candidates', if(list_contains(stored_keys, 'routeaudit.decision.candidates'), null, a_decision_candidates)
        ))) as attributes
        -- noqa: enable=LT05
    from stored
)

select * from final
