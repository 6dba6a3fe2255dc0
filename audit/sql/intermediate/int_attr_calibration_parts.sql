-- int_attr_calibration_parts: calibration's mergeable summary per time partition. One row per
-- (part, run_id, router_id, policy, replica): counts and sums that add up across partitions, and
-- the telemetry ages as a histogram of log buckets 1 % wide (bucket b holds ages a with
-- 1.01^b <= 1 + a < 1.01^(b+1); negative ages, from clocks out of step, mirror it below -1;
-- each with its count and its smallest and largest age), so
-- calibration per run merges partitions without reading a run's whole history and a new
-- partition leaves the others' rows as they are. part is the partition of the decision's
-- request.
with

assessed as (
    select * from int_attr_candidates_assessed
),

thresholds as (
    select * from int_attr_thresholds
),

candidate_rows as (
    select
        a.part,
        a.run_id,
        coalesce(a.decision_router_id, a.router_id) as router_id,
        coalesce(a.decision_policy, a.policy) as policy,
        a.replica,
        a.chosen,
        a.evidence_source,
        a.telemetry_age_ms,
        -- this decision's prediction for the replica (a retried request's earlier attempts
        -- are scored on their own prediction, not on the final attempt's)
        a.candidate_predicted_cached_tokens as predicted,
        case when a.chosen then a.exec_cached_tokens end as actual,
        t.cache_tolerance_tokens as tol,
        case
            when a.telemetry_age_ms >= 0
                then cast(floor(ln(1 + a.telemetry_age_ms) / ln(1.01)) as integer)
            else -1 - cast(floor(ln(1 - a.telemetry_age_ms) / ln(1.01)) as integer)
        end as age_bucket
    from assessed as a
    cross join thresholds as t
    where a.replica is not null
),

sums as (
    select
        part,
        run_id,
        router_id,
        policy,
        replica,
        count(*) as candidates,
        count(*) filter (where chosen) as decisions,
        count(*) filter (where chosen and predicted is not null and actual is not null)
            as compared,
        count(*) filter (
            where chosen and predicted >= tol and actual >= predicted - tol
        ) as hits,
        count(*) filter (
            where chosen and predicted >= tol and actual < predicted - tol
        ) as false_hits,
        count(*) filter (
            where chosen and coalesce(predicted, 0) < tol and actual >= tol
        ) as misses,
        sum(abs(predicted - actual)) filter (where chosen) as abs_error_tokens,
        sum(predicted - actual) filter (where chosen) as error_tokens,
        sum(predicted) filter (where chosen) as predicted_tokens,
        sum(actual) filter (where chosen and predicted is not null) as actual_tokens,
        max(telemetry_age_ms) as telemetry_age_max_ms,
        count(*) filter (where evidence_source = 'reconstructed') as reconstructed
    from candidate_rows
    group by part, run_id, router_id, policy, replica
),

age_counts as (
    select
        part,
        run_id,
        router_id,
        policy,
        replica,
        age_bucket,
        count(*) as n,
        min(telemetry_age_ms) as lo,
        max(telemetry_age_ms) as hi
    from candidate_rows
    where age_bucket is not null
    group by part, run_id, router_id, policy, replica, age_bucket
),

histograms as (
    select
        part,
        run_id,
        router_id,
        policy,
        replica,
        list({ 'bucket': age_bucket, 'n': n, 'lo': lo, 'hi': hi } order by age_bucket)
            as age_histogram
    from age_counts
    group by part, run_id, router_id, policy, replica
),

final as (
    select
        s.*,
        h.age_histogram
    from sums as s
    left join histograms as h
        on
            s.part = h.part
            and s.run_id is not distinct from h.run_id
            and s.router_id is not distinct from h.router_id
            and s.policy is not distinct from h.policy
            and s.replica = h.replica
)

select * from final
