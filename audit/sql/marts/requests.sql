-- PLACEHOLDER: the real requests relation is being written; same columns as docs/schema.md.
with final as (
    select
        cast(null as varchar) as request_id,
        cast(null as varchar) as trace_id,
        cast(null as varchar) as run_id,
        cast(null as varchar) as model,
        cast(null as varchar) as endpoint,
        cast(null as bigint) as input_tokens,
        cast(null as bigint) as max_tokens,
        cast(null as boolean) as stream,
        cast(null as timestamptz) as client_start,
        cast(null as double) as ttft_ms,
        cast(null as double) as tpot_ms,
        cast(null as double) as e2e_ms,
        cast(null as bigint) as output_tokens,
        cast(null as varchar) as finish_reason,
        cast(null as varchar) as status,
        cast(null as bigint) as http_status,
        cast(null as varchar) as router_id,
        cast(null as varchar) as policy,
        cast(null as bigint) as attempts,
        cast(null as varchar) as chosen_replica,
        cast(null as varchar) as served_by,
        cast(null as bigint) as predicted_cached_tokens,
        cast(null as bigint) as actual_cached_tokens,
        cast(null as double) as router_ms,
        cast(null as double) as queue_ms,
        cast(null as double) as prefill_ms,
        cast(null as double) as decode_ms,
        cast(null as double) as replica_ttft_ms,
        cast(null as boolean) as has_client,
        cast(null as boolean) as has_router,
        cast(null as boolean) as has_replica,
        cast(null as boolean) as router_side_missing,
        cast(null as varchar) as link_method,
        cast(null as boolean) as clock_suspect
    where false
)

select * from final
