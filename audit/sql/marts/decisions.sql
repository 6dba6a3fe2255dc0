-- PLACEHOLDER: the real decisions relation is being written; same columns as docs/schema.md.
with final as (
    select
        cast(null as varchar) as request_id,
        cast(null as bigint) as attempt,
        cast(null as varchar) as trace_id,
        cast(null as varchar) as span_id,
        cast(null as varchar) as router_id,
        cast(null as varchar) as policy,
        cast(null as timestamptz) as decided_at,
        cast(null as bigint) as decided_ns,
        cast(null as varchar) as chosen_replica,
        cast(null as varchar) as reason,
        cast(null as varchar) as outcome,
        cast(null as bigint) as candidate_count,
        cast(null as bigint) as forward_status,
        cast(null as double) as forward_ms,
        cast(null as boolean) as recorded
    where false
)

select * from final
