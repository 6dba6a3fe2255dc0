-- PLACEHOLDER: the real candidates relation is being written; same columns as docs/schema.md.
with final as (
    select
        cast(null as varchar) as request_id,
        cast(null as bigint) as attempt,
        cast(null as varchar) as decision_span_id,
        cast(null as varchar) as replica,
        cast(null as boolean) as eligible,
        cast(null as varchar) as excluded_reason,
        cast(null as boolean) as chosen,
        cast(null as bigint) as waiting,
        cast(null as bigint) as running,
        cast(null as double) as kv_usage,
        cast(null as bigint) as remaining_tokens,
        cast(null as timestamptz) as telemetry_ts,
        cast(null as double) as telemetry_age_ms,
        cast(null as bigint) as pending,
        cast(null as bigint) as predicted_cached_tokens,
        cast(null as double) as est_queue_ms,
        cast(null as double) as est_prefill_ms,
        cast(null as double) as score
    where false
)

select * from final
