-- slo_summary: one row per run_id (null run = traffic outside any run). Every request counts
-- in the denominators: attainment = good / requests; goodput_rps = good requests per second
-- of the run's window (first client start to last end). Failures are counted by kind, never
-- dropped. Latency percentiles are over successful requests only.
with

judged as (
    select * from int_attr_requests_judged
),

windowed as (
    select
        *,
        client_start
        + to_microseconds(cast(round(coalesce(e2e_ms, 0.0) * 1000) as bigint))
            as ended_at
    from judged
),

summarised as (
    select
        run_id,
        any_value(ttft_slo_ms) as ttft_slo_ms,
        any_value(tpot_slo_ms) as tpot_slo_ms,
        count(*) as requests,
        count(*) filter (where is_ok) as ok,
        count(*) filter (where is_slow) as slow,
        count(*) filter (where is_good) as goodput,
        count(*) filter (where status = 'timeout') as timeouts,
        count(*) filter (where status = 'rejected') as rejected,
        count(*) filter (where status = 'error') as errors,
        count(*) filter (where status = 'cancelled') as cancelled,
        count(*) filter (where outcome = 'other') as other_status,
        count(*) filter (where not is_ok and failure_source = 'client')
            as client_failures,
        count(*) filter (where not is_ok and failure_source = 'router')
            as router_failures,
        count(*) filter (where not is_ok and failure_source = 'replica')
            as replica_failures,
        count(*) filter (where is_ok and coalesce(output_tokens, 0) < 2)
            as ok_without_tpot,
        min(client_start) as first_at,
        max(ended_at) as last_at,
        quantile_cont(ttft_ms, 0.5) filter (where is_ok) as ttft_p50_ms,
        quantile_cont(ttft_ms, 0.9) filter (where is_ok) as ttft_p90_ms,
        quantile_cont(ttft_ms, 0.99) filter (where is_ok) as ttft_p99_ms,
        quantile_cont(tpot_ms, 0.5) filter (where is_ok) as tpot_p50_ms,
        quantile_cont(tpot_ms, 0.9) filter (where is_ok) as tpot_p90_ms,
        quantile_cont(tpot_ms, 0.99) filter (where is_ok) as tpot_p99_ms
    from windowed
    group by all
),

final as (
    select
        run_id,
        ttft_slo_ms,
        tpot_slo_ms,
        requests,
        ok,
        slow,
        goodput,
        date_diff('microsecond', first_at, last_at) / 1e6 as window_s,
        goodput
        / nullif(date_diff('microsecond', first_at, last_at) / 1e6, 0)
            as goodput_rps,
        goodput / nullif(requests, 0) as attainment,
        timeouts,
        rejected,
        errors,
        cancelled,
        other_status,
        client_failures,
        router_failures,
        replica_failures,
        ok_without_tpot,
        ttft_p50_ms,
        ttft_p90_ms,
        ttft_p99_ms,
        tpot_p50_ms,
        tpot_p90_ms,
        tpot_p99_ms
    from summarised
)

select * from final
