-- int_attr_requests_judged: one row per request (requests mart), judged against slo_targets.
-- Goodput follows vLLM's benchmark: a request counts only if it succeeded and met every
-- target; fewer than 2 output tokens has no TPOT (the TPOT target is met by definition).
-- Failures (timeout, rejected, error, cancelled) stay in every denominator.
with

all_requests as (
    select * from requests
    -- routeaudit_scope_run / routeaudit_scope_request (no default: unset means all) limit a
    -- live computation to one run or one request. What the live views compute across
    -- requests is per run or comes from tables (int_attr_client_gaps, the state), so the
    -- rows of the requests in scope are the same either way (docs/attribution.md)
    where
        (
            getvariable('routeaudit_scope_run') is null
            or run_id = getvariable('routeaudit_scope_run')
        )
        and (
            getvariable('routeaudit_scope_request') is null
            or request_id = getvariable('routeaudit_scope_request')
        )
),

targets as (
    select * from slo_targets
),

measured as (
    select
        r.* replace (
            -- no status recorded counts as ok (as in audit/queries.py)
            coalesce(r.status, 'ok') as status,
            -- a non-streamed answer has no separate first token: its TTFT is its latency
            coalesce(r.ttft_ms, r.e2e_ms) as ttft_ms
        ),
        t.ttft_slo_ms,
        t.tpot_slo_ms
    from all_requests as r
    cross join targets as t
),

judged as (
    select
        *,
        status = 'ok' as is_ok,
        coalesce(ttft_ms <= ttft_slo_ms, false) as ttft_met,
        coalesce(output_tokens, 0) < 2
        or tpot_ms is null
        or tpot_ms <= tpot_slo_ms as tpot_met
    from measured
),

classified as (
    select
        *,
        is_ok and ttft_met and tpot_met as is_good,
        is_ok and not (ttft_met and tpot_met) as is_slow,
        case
            when is_ok and ttft_met and tpot_met then 'good'
            when is_ok then 'slow'
            when status in ('timeout', 'rejected', 'error', 'cancelled')
                then status
            else 'other'
        end as outcome,
        case
            when not ttft_met and not tpot_met then 'ttft+tpot'
            when not ttft_met then 'ttft'
            when not tpot_met then 'tpot'
        end as missed,
        greatest(coalesce(ttft_ms - ttft_slo_ms, 0.0), 0.0) as ttft_excess_ms,
        -- TPOT excess as decode milliseconds: per-token excess times the tokens after the first
        case
            when coalesce(output_tokens, 0) >= 2 and tpot_ms > tpot_slo_ms
                then (tpot_ms - tpot_slo_ms) * (output_tokens - 1)
            else 0.0
        end as tpot_excess_ms
    from judged
),

final as (
    select
        *,
        ttft_excess_ms + tpot_excess_ms as total_excess_ms,
        -- slow successes and timeouts are explained; other failures are only counted
        is_slow or status = 'timeout' as needs_attribution
    from classified
)

select * from final
