-- int_slo_summary_parts: slo_summary's mergeable summary per time partition. One row per (part,
-- run_id): the counts, which add up across partitions, the run's first start and last end in
-- the partition, and the successful requests' TTFT and TPOT as lists, so slo_summary per run
-- merges a run's partitions (its percentiles are exact: the same values) without judging its
-- whole history again, and a new partition leaves the others' rows as they are. part is the
-- request's partition.
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

final as (
    select
        part,
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
        list(ttft_ms) filter (where is_ok and ttft_ms is not null)
            as ok_ttft_ms,
        list(tpot_ms) filter (where is_ok and tpot_ms is not null)
            as ok_tpot_ms
    from windowed
    group by part, run_id
)

select * from final
