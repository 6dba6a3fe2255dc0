-- PLACEHOLDER: the real executions relation is being written; same columns as docs/schema.md.
with final as (
    select
        cast(null as varchar) as request_id,
        cast(null as varchar) as trace_id,
        cast(null as varchar) as span_id,
        cast(null as varchar) as replica,
        cast(null as bigint) as dp_rank,
        cast(null as timestamptz) as start_at,
        cast(null as timestamptz) as end_at,
        cast(null as double) as queue_ms,
        cast(null as double) as prefill_ms,
        cast(null as double) as decode_ms,
        cast(null as double) as ttft_ms,
        cast(null as double) as e2e_ms,
        cast(null as bigint) as input_tokens,
        cast(null as bigint) as output_tokens,
        cast(null as bigint) as cached_tokens,
        cast(null as varchar) as finish_reason,
        cast(null as bigint) as preemptions,
        cast(null as varchar) as status
    where false
)

select * from final
