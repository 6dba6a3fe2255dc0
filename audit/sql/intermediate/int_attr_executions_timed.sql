-- int_attr_executions_timed: one row per execution (executions mart) with its phase boundaries
-- on the reference clock: arrival (start_at), prefill start (start_at + queue), first token
-- (start_at + TTFT) and end. Durations are the engine's own; only start_at/end_at are
-- cross-host corrected. Also the uncached prompt tokens, the request's run and its time
-- partition (what the windowed fits of int_attr_replica_fits group by). Requests are
-- keyed by request_key throughout the attribution layer: request ids repeat (across runs, or a
-- client reusing them) and must not merge two requests.
with

all_executions as (
    select * from executions
),

request_runs as (
    select
        request_key,
        any_value(run_id) as run_id,
        any_value(part) as part
    from requests
    group by request_key
),

durations as (
    select
        e.*,
        coalesce(e.queue_ms, greatest(e.ttft_ms - e.prefill_ms, 0.0), 0.0)
            as queue_ms_eff,
        coalesce(e.ttft_ms, e.queue_ms + e.prefill_ms) as ttft_ms_eff,
        greatest(
            coalesce(e.input_tokens, 0) - coalesce(e.cached_tokens, 0), 0
        ) as uncached_tokens
    from all_executions as e
),

timed as (
    select
        *,
        start_at
        + to_microseconds(cast(round(queue_ms_eff * 1000) as bigint))
            as prefill_start_at,
        start_at
        + to_microseconds(
            cast(round(coalesce(ttft_ms_eff, queue_ms_eff) * 1000) as bigint)
        ) as first_token_at,
        coalesce(
            end_at,
            start_at + to_microseconds(cast(round(e2e_ms * 1000) as bigint)),
            start_at
            + to_microseconds(
                cast(round(coalesce(ttft_ms_eff, queue_ms_eff) * 1000) as bigint)
            )
        ) as end_at_eff
    from durations
),

final as (
    select
        t.*,
        r.run_id,
        r.part
    from timed as t
    left join request_runs as r
        on t.request_key = r.request_key
)

select * from final
