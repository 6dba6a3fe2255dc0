-- executions: one row per replica-side execution (grain: trace_id, span_id of the replica's
-- span: vLLM llm_request, routeaudit replica middleware, SGLang "Req" root span).
-- Engine latencies (vLLM gen_ai.latency.*, seconds) become ms; they are on the engine's clock.
-- start_at / end_at are on the reference clock.
with

int_spans_clock_corrected_source as (

    select * from int_spans_clock_corrected

),

replica_spans as (

    select *
    from int_spans_clock_corrected_source
    where span_role = 'replica'

),

final as (

    select
        request_key,
        request_id,
        trace_id,
        span_id,
        dialect,
        self_replica as replica,
        dp_rank,
        clock_domain,
        to_timestamp(corrected_start_ns / 1e9) as start_at,
        to_timestamp(corrected_end_ns / 1e9) as end_at,
        engine_queue_ms as queue_ms,
        engine_prefill_ms as prefill_ms,
        engine_decode_ms as decode_ms,
        engine_ttft_ms as ttft_ms,
        coalesce(engine_e2e_ms, duration_ms) as e2e_ms,
        usage_input_tokens as input_tokens,
        usage_output_tokens as output_tokens,
        usage_cached_tokens as cached_tokens,
        finish_reason,
        preemptions,
        case
            when declared_status in (
                'ok', 'error', 'timeout', 'cancelled', 'rejected'
            ) then declared_status
            when finish_reason = 'abort' then 'cancelled'
            when otel_status = 'error' or http_status >= 400 then 'error'
            else 'ok'
        end as status
    from replica_spans

)

select * from final
