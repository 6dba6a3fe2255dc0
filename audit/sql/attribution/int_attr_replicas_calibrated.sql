-- int_attr_replicas_calibrated: one row per (run_id, replica) seen in executions.
-- Prefill model: prefill_ms = intercept + slope * uncached_tokens, least squares over the
-- replica's own executions of the run when it has at least calibration_min_n of them (and a
-- positive slope), else the run's pooled fit ("fleet"), else the pooled ratio
-- sum(prefill_ms) / sum(uncached_tokens). Decode: median decode ms per token after the
-- first. fleet_* columns are the run's reference (median of the per-replica fits).
with

timed as (
    select * from int_attr_executions_timed
),

thresholds as (
    select * from int_attr_thresholds
),

prefill_points as (
    select
        run_id,
        replica,
        prefill_ms,
        uncached_tokens,
        case
            when output_tokens >= 2 and decode_ms is not null
                then decode_ms / (output_tokens - 1)
        end as decode_ms_per_token,
        queue_ms_eff
    from timed
),

per_replica as (
    select
        run_id,
        replica,
        count(*) as executions,
        count(prefill_ms) filter (where uncached_tokens > 0) as prefill_n,
        regr_slope(prefill_ms, uncached_tokens)
            filter (where uncached_tokens > 0) as fit_slope,
        regr_intercept(prefill_ms, uncached_tokens)
            filter (where uncached_tokens > 0) as fit_intercept,
        sum(prefill_ms) filter (where uncached_tokens > 0)
        / nullif(
            sum(uncached_tokens) filter (where prefill_ms is not null), 0
        ) as ratio_ms_per_token,
        median(decode_ms_per_token) as decode_ms_per_token,
        median(queue_ms_eff) as queue_p50_ms,
        quantile_cont(queue_ms_eff, 0.9) as queue_p90_ms
    from prefill_points
    group by all
),

pooled as (
    select
        run_id,
        regr_slope(prefill_ms, uncached_tokens)
            filter (where uncached_tokens > 0) as pooled_slope,
        regr_intercept(prefill_ms, uncached_tokens)
            filter (where uncached_tokens > 0) as pooled_intercept,
        sum(prefill_ms) filter (where uncached_tokens > 0)
        / nullif(
            sum(uncached_tokens) filter (where prefill_ms is not null), 0
        ) as pooled_ratio,
        median(decode_ms_per_token) as pooled_decode_ms_per_token
    from prefill_points
    group by all
),

chosen_fit as (
    select
        p.run_id,
        p.replica,
        p.executions,
        p.prefill_n,
        p.decode_ms_per_token,
        p.queue_p50_ms,
        p.queue_p90_ms,
        q.pooled_decode_ms_per_token,
        case
            when p.prefill_n >= t.calibration_min_n and p.fit_slope > 0
                then 'replica'
            when p.prefill_n >= 1 and p.ratio_ms_per_token > 0
                and p.prefill_n >= t.calibration_min_n
                then 'replica_ratio'
            when q.pooled_slope > 0 then 'fleet'
            else 'fleet_ratio'
        end as calibrated_from,
        p.fit_slope,
        p.fit_intercept,
        p.ratio_ms_per_token,
        q.pooled_slope,
        q.pooled_intercept,
        q.pooled_ratio
    from per_replica as p
    left join pooled as q
        on p.run_id is not distinct from q.run_id
    cross join thresholds as t
),

calibrated as (
    select
        run_id,
        replica,
        executions,
        prefill_n,
        calibrated_from,
        case calibrated_from
            when 'replica' then fit_slope
            when 'replica_ratio' then ratio_ms_per_token
            when 'fleet' then pooled_slope
            else pooled_ratio
        end as prefill_ms_per_token,
        case calibrated_from
            when 'replica' then greatest(fit_intercept, 0.0)
            when 'fleet' then greatest(pooled_intercept, 0.0)
            else 0.0
        end as prefill_intercept_ms,
        coalesce(decode_ms_per_token, pooled_decode_ms_per_token)
            as decode_ms_per_token,
        queue_p50_ms,
        queue_p90_ms
    from chosen_fit
),

fleet as (
    select
        run_id,
        median(prefill_ms_per_token) as fleet_prefill_ms_per_token,
        median(prefill_intercept_ms) as fleet_prefill_intercept_ms,
        median(decode_ms_per_token) as fleet_decode_ms_per_token
    from calibrated
    group by all
),

final as (
    select
        c.*,
        f.fleet_prefill_ms_per_token,
        f.fleet_prefill_intercept_ms,
        f.fleet_decode_ms_per_token
    from calibrated as c
    left join fleet as f
        on c.run_id is not distinct from f.run_id
)

select * from final
