-- decisions: one row per routing attempt (grain: request_key, attempt; decision_id is unique
-- too). routeaudit routers record them (recorded = true, with candidate events); for SMG,
-- vllm-router and production-stack they are reconstructed from the router's own spans
-- (recorded = false, no candidates, policy only when the router names it).
with

int_decisions_joined_to_executions_source as (

    select * from int_decisions_joined_to_executions

),

final as (

    select
        request_key,
        request_id,
        attempt,
        decision_id,
        trace_id,
        span_id,
        dialect,
        router_id,
        policy,
        to_timestamp(corrected_decided_ns / 1e9) as decided_at,
        decided_ns,
        chosen_replica,
        reason,
        outcome,
        candidate_count,
        forward_status,
        forward_ms,
        recorded,
        execution_span_id,
        served_by,
        clock_status = 'inconsistent' as clock_suspect
    from int_decisions_joined_to_executions_source

)

select * from final
