-- stg_spans: one row per span (grain: trace_id, span_id), renamed, cast and classified.
-- No joins, no aggregation. Role and dialect come from routeaudit.component, span and scope
-- names, service names and the attributes each emitter is known to send (docs/semconv.md).
with

raw_spans_source as (

    select * from raw_spans

),

spans_with_aliases_resolved as (

    select
        trace_id,
        span_id,
        parent_span_id,
        name as span_name,
        kind as span_kind,
        start_ns,
        end_ns,
        (end_ns - start_ns) / 1e6 as duration_ms,
        status_code as otel_status,
        status_message,
        scope_name,
        service_name,
        service_instance_id,
        host_name,
        coalesce(host_name, service_instance_id, service_name, 'unknown')
            as clock_domain,
        a_component as component,
        coalesce(a_run_id, r_run_id) as run_id,
        coalesce(a_model, a_response_model) as model,
        a_max_tokens as max_tokens,
        a_input_tokens as request_input_tokens,
        a_stream as stream,
        coalesce(
            a_http_method,
            a_method,
            a_http_method_legacy
        ) as http_method,
        coalesce(
            a_endpoint,
            a_url_path,
            a_smg_uri,
            a_http_route,
            a_http_target,
            regexp_extract(
                a_url_full, '^[A-Za-z][A-Za-z0-9+.-]*://[^/]+(/[^?#]*)', 1
            )
        ) as raw_endpoint,
        coalesce(
            a_http_status,
            a_smg_status_code,
            a_http_status_legacy
        ) as http_status,
        a_status as declared_status,
        a_client_ttft_ms as client_ttft_ms,
        a_router_ttfb_ms as router_ttfb_ms,
        a_client_tpot_ms as client_tpot_ms,
        a_client_e2e_ms as client_e2e_ms,
        a_client_itl_max_ms as client_itl_max_ms,
        a_client_error as client_error,
        coalesce(a_usage_input_tokens, a_usage_prompt_tokens)
            as usage_input_tokens,
        coalesce(a_usage_output_tokens, a_usage_completion_tokens)
            as usage_output_tokens,
        coalesce(
            a_usage_cache_read_tokens,
            a_usage_cached_tokens,
            a_client_cached_tokens
        ) as usage_cached_tokens,
        a_finish_reasons[1] as finish_reason,
        a_lat_ttft_s * 1000.0 as engine_ttft_ms,
        a_lat_e2e_s * 1000.0 as engine_e2e_ms,
        a_lat_queue_s * 1000.0 as engine_queue_ms,
        a_lat_prefill_s * 1000.0 as engine_prefill_ms,
        a_lat_decode_s * 1000.0 as engine_decode_ms,
        a_lat_inference_s * 1000.0 as engine_inference_ms,
        a_preemptions as preemptions,
        a_attempt as attempt,
        coalesce(a_router_id, r_router_id) as declared_router_id,
        a_policy as declared_policy,
        a_chosen as declared_chosen,
        a_reason as decision_reason,
        a_decision_outcome as decision_outcome,
        a_candidate_count as declared_candidate_count,
        coalesce(a_decision_time_ns, start_ns) as decided_ns,
        a_recorder_errors as recorder_errors,
        a_dp_rank as dp_rank,
        a_request_id as routeaudit_request_id,
        a_router_request_id as router_request_id,
        a_gen_ai_request_id as gen_ai_request_id,
        a_rid as sglang_rid,
        a_routing_logic as prodstack_routing_logic,
        -- what this span names as the replica: its own id for replica spans,
        -- the target for forward spans; normalised below
        coalesce(
            a_replica_id,
            a_url_full,
            a_backend_url,
            a_server_address || ':' || cast(a_server_port as varchar)
        ) as raw_target,
        coalesce(a_replica_id, r_replica_id, service_instance_id, service_name)
            as raw_self_replica,
        a_code_namespace as code_namespace
    from raw_spans_source

),

spans_with_dialect as (

    select
        *,
        case
            when component is not null
                or span_name like 'routeaudit.%' then 'routeaudit'
            when raw_target is not null and prodstack_routing_logic is not null
                then 'prodstack'
            when scope_name = 'smg'
                or code_namespace like 'smg::%'
                or code_namespace like 'sglang_router%'
                or service_name in ('smg', 'sglang-router', 'sgl-router')
                then 'smg'
            when scope_name = 'vllm-router'
                or code_namespace like 'vllm_router_rs%' then 'vllm_router'
            when sglang_rid is not null
                or span_name like 'Req %' then 'sglang'
            when span_name = 'llm_request'
                or scope_name like 'vllm%' then 'vllm'
            else 'other'
        end as dialect
    from spans_with_aliases_resolved

),

spans_with_role as (

    select
        *,
        case
            when component = 'client' or span_name = 'routeaudit.client'
                then 'client'
            when span_name = 'routeaudit.decision' then 'router_decision'
            when span_name = 'routeaudit.forward' then 'router_forward'
            when component = 'replica' or span_name = 'llm_request'
                then 'replica'
            when component = 'router' and span_kind = 'server'
                then 'router_server'
            when dialect = 'smg' and span_name = 'http_request'
                then 'router_server'
            when dialect = 'vllm_router' and span_kind = 'server'
                then 'router_server'
            when dialect = 'vllm_router' and span_kind = 'client'
                then 'router_forward'
            when dialect = 'prodstack' and span_kind = 'client'
                then 'router_forward'
            when dialect = 'prodstack' then 'router_server'
            when dialect = 'sglang' and sglang_rid is not null then 'replica'
            else 'other'
        end as span_role,
        lower(regexp_replace(raw_endpoint, '[?#].*$', '')) as endpoint
    from spans_with_dialect

),

spans_with_ids as (

    select
        *,
        case
            when regexp_matches(gen_ai_request_id, '^chatcmpl-.+$')
                then regexp_extract(gen_ai_request_id, '^chatcmpl-(.+)$', 1)
            when regexp_matches(gen_ai_request_id, '^cmpl-.+-[0-9]+$')
                then regexp_extract(gen_ai_request_id, '^cmpl-(.+)-[0-9]+$', 1)
            else gen_ai_request_id
        end as engine_request_id,
        coalesce(
            upper(http_method) = 'GET',
            false
        )
        or coalesce(
            endpoint in (
                '/health', '/health_generate', '/healthz', '/readiness',
                '/liveness', '/ping', '/version', '/metrics', '/v1/models',
                '/models', '/get_server_info', '/get_model_info',
                '/server_info', '/workers', '/list_workers'
            )
            or endpoint like '%/health%',
            false
        ) as is_probe
    from spans_with_role

),

spans_with_replica_normalised as (

    select
        *,
        coalesce(
            routeaudit_request_id, router_request_id, engine_request_id,
            sglang_rid
        ) as request_id,
        case
            when nullif(trim(raw_target), '') is null then null
            when regexp_matches(trim(raw_target), '^[A-Za-z][A-Za-z0-9+.-]*://')
                or regexp_matches(
                    trim(raw_target), '^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$'
                )
                then regexp_replace(
                    regexp_extract(
                        lower(trim(raw_target)),
                        '^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?'
                        || '((?:\[[^\]]+\]|[^/:?#]+)(?::[0-9]+)?)',
                        1
                    ),
                    '^(localhost|0\.0\.0\.0|\[::1\]|\[::\])(:|$)',
                    '127.0.0.1\2'
                )
            else trim(raw_target)
        end
        || case when dp_rank > 0 then '#' || cast(dp_rank as varchar) else '' end
            as target_replica,
        case
            when nullif(trim(raw_self_replica), '') is null then null
            when regexp_matches(
                    trim(raw_self_replica), '^[A-Za-z][A-Za-z0-9+.-]*://'
                )
                or regexp_matches(
                    trim(raw_self_replica),
                    '^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$'
                )
                then regexp_replace(
                    regexp_extract(
                        lower(trim(raw_self_replica)),
                        '^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?'
                        || '((?:\[[^\]]+\]|[^/:?#]+)(?::[0-9]+)?)',
                        1
                    ),
                    '^(localhost|0\.0\.0\.0|\[::1\]|\[::\])(:|$)',
                    '127.0.0.1\2'
                )
            else trim(raw_self_replica)
        end
        || case when dp_rank > 0 then '#' || cast(dp_rank as varchar) else '' end
            as self_replica,
        case
            when nullif(trim(declared_chosen), '') is null then null
            when regexp_matches(trim(declared_chosen), '^[A-Za-z][A-Za-z0-9+.-]*://')
                or regexp_matches(
                    trim(declared_chosen), '^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$'
                )
                then regexp_replace(
                    regexp_extract(
                        lower(trim(declared_chosen)),
                        '^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?'
                        || '((?:\[[^\]]+\]|[^/:?#]+)(?::[0-9]+)?)',
                        1
                    ),
                    '^(localhost|0\.0\.0\.0|\[::1\]|\[::\])(:|$)',
                    '127.0.0.1\2'
                )
            else trim(declared_chosen)
        end
            as chosen_replica
    from spans_with_ids

),

final as (

    select
        trace_id,
        span_id,
        parent_span_id,
        span_name,
        span_kind,
        span_role,
        dialect,
        is_probe,
        clock_domain,
        start_ns,
        end_ns,
        duration_ms,
        otel_status,
        status_message,
        scope_name,
        service_name,
        service_instance_id,
        host_name,
        component,
        run_id,
        request_id,
        routeaudit_request_id,
        router_request_id,
        gen_ai_request_id,
        engine_request_id,
        sglang_rid,
        model,
        endpoint,
        http_method,
        http_status,
        declared_status,
        max_tokens,
        request_input_tokens,
        stream,
        client_ttft_ms,
        router_ttfb_ms,
        client_tpot_ms,
        client_e2e_ms,
        client_itl_max_ms,
        client_error,
        usage_input_tokens,
        usage_output_tokens,
        usage_cached_tokens,
        finish_reason,
        engine_ttft_ms,
        engine_e2e_ms,
        engine_queue_ms,
        engine_prefill_ms,
        engine_decode_ms,
        engine_inference_ms,
        preemptions,
        attempt,
        coalesce(
            declared_router_id, service_instance_id, host_name, service_name
        ) as router_id,
        coalesce(declared_policy, prodstack_routing_logic) as policy,
        chosen_replica,
        decision_reason,
        decision_outcome,
        declared_candidate_count,
        decided_ns,
        recorder_errors,
        dp_rank,
        raw_target,
        target_replica,
        self_replica
    from spans_with_replica_normalised

)

select * from final
