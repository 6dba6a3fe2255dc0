-- int_attr_replica_fits: one row per (run, replica) with executions: the raw prefill fit
-- (least squares of prefill_ms on uncached tokens, and the ratio) and decode ms/token, plus the
-- run's pooled values. Independent of the thresholds: int_attr_candidates_assessed chooses
-- between them with calibration_min_n. docs/attribution.md, "Calibration".
with

timed_executions as (
    select * from int_attr_executions_timed
),

run_of_request as (
    select
        request_id,
        any_value(run_id) as run_id
    from requests
    group by all
),

timed as (
    select
        e.*,
        r.run_id
    from timed_executions as e
    left join run_of_request as r
        on e.request_id = r.request_id
),

calibration_points as (
    select
        run_id,
        replica,
        prefill_ms,
        uncached_tokens,
        case
            when output_tokens >= 2 and decode_ms is not null
                then decode_ms / (output_tokens - 1)
        end as decode_ms_per_token
    from timed
    where replica is not null
),
calibration_per_replica as (
    select
        run_id,
        replica,
        count(prefill_ms) filter (where uncached_tokens > 0) as prefill_n,
        -- a fit needs spread in prompt length (else regr_* give NaN)
        case
            when regr_sxx(prefill_ms, uncached_tokens)
                filter (where uncached_tokens > 0) > 0
                then regr_slope(prefill_ms, uncached_tokens)
                    filter (where uncached_tokens > 0)
        end as fit_slope,
        case
            when regr_sxx(prefill_ms, uncached_tokens)
                filter (where uncached_tokens > 0) > 0
                then regr_intercept(prefill_ms, uncached_tokens)
                    filter (where uncached_tokens > 0)
        end as fit_intercept,
        sum(prefill_ms) filter (where uncached_tokens > 0)
        / nullif(
            sum(uncached_tokens)
                filter (where uncached_tokens > 0 and prefill_ms is not null),
            0
        ) as fit_ratio,
        median(decode_ms_per_token) as decode_ms_per_token
    from calibration_points
    group by all
),
calibration_pooled as (
    select
        run_id,
        -- a fit needs spread in prompt length (else regr_* give NaN)
        case
            when regr_sxx(prefill_ms, uncached_tokens)
                filter (where uncached_tokens > 0) > 0
                then regr_slope(prefill_ms, uncached_tokens)
                    filter (where uncached_tokens > 0)
        end as pooled_slope,
        case
            when regr_sxx(prefill_ms, uncached_tokens)
                filter (where uncached_tokens > 0) > 0
                then regr_intercept(prefill_ms, uncached_tokens)
                    filter (where uncached_tokens > 0)
        end as pooled_intercept,
        sum(prefill_ms) filter (where uncached_tokens > 0)
        / nullif(
            sum(uncached_tokens)
                filter (where uncached_tokens > 0 and prefill_ms is not null),
            0
        ) as pooled_ratio,
        median(decode_ms_per_token) as pooled_decode_ms_per_token
    from calibration_points
    group by all
),
final as (
    select
        p.*,
        q.* exclude (run_id)
    from calibration_per_replica as p
    left join calibration_pooled as q
        on p.run_id is not distinct from q.run_id
)

select * from final
