-- slo_summary: one row per run_id (null run = traffic outside any run). Every request counts
-- in the denominators: attainment = good / requests; goodput_rps = good requests per second
-- of the run's window (first client start to last end). Failures are counted by kind, never
-- dropped. Latency percentiles are over successful requests only. A run is merged from its
-- partitions' rows (int_slo_summary_parts): sums, and the percentiles of the same values.
with

parts as (
    -- per partition: counts, the first start and last end, the successful requests' latencies
    select * from int_slo_summary_parts
),

summarised as (
    select
        run_id,
        any_value(ttft_slo_ms) as ttft_slo_ms,
        any_value(tpot_slo_ms) as tpot_slo_ms,
        cast(sum(requests) as bigint) as requests,
        cast(sum(ok) as bigint) as ok,
        cast(sum(slow) as bigint) as slow,
        cast(sum(goodput) as bigint) as goodput,
        cast(sum(timeouts) as bigint) as timeouts,
        cast(sum(rejected) as bigint) as rejected,
        cast(sum(errors) as bigint) as errors,
        cast(sum(cancelled) as bigint) as cancelled,
        cast(sum(other_status) as bigint) as other_status,
        cast(sum(client_failures) as bigint) as client_failures,
        cast(sum(router_failures) as bigint) as router_failures,
        cast(sum(replica_failures) as bigint) as replica_failures,
        cast(sum(ok_without_tpot) as bigint) as ok_without_tpot,
        min(first_at) as first_at,
        max(last_at) as last_at,
        flatten(list(ok_ttft_ms)) as ok_ttft_ms,
        flatten(list(ok_tpot_ms)) as ok_tpot_ms
    from parts
    group by run_id
),

with_percentiles as (
    select
        * exclude (ok_ttft_ms, ok_tpot_ms),
        list_aggregate(ok_ttft_ms, 'quantile_cont', 0.5) as ttft_p50_ms,
        list_aggregate(ok_ttft_ms, 'quantile_cont', 0.9) as ttft_p90_ms,
        list_aggregate(ok_ttft_ms, 'quantile_cont', 0.99) as ttft_p99_ms,
        list_aggregate(ok_tpot_ms, 'quantile_cont', 0.5) as tpot_p50_ms,
        list_aggregate(ok_tpot_ms, 'quantile_cont', 0.9) as tpot_p90_ms,
        list_aggregate(ok_tpot_ms, 'quantile_cont', 0.99) as tpot_p99_ms
    from summarised
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
    from with_percentiles
)

select * from final
