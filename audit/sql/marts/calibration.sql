-- calibration: how well routers' views matched the replicas. One row per
-- (run_id, router_id, policy, replica) with scope 'replica', plus one per (run_id, router_id,
-- policy) with scope 'router' and replica null. Cache columns compare, for executed decisions,
-- the router's predicted cached tokens on the chosen replica with what the replica reported
-- (tolerance cache_tolerance_tokens): hits (prediction held), false_hits (predicted more than
-- was there), misses (a hit the router did not predict). Telemetry-age columns describe the
-- age of the telemetry behind every candidate the router scored. The quantiles merge the
-- partitions' 1 % log-bucket histograms (int_attr_calibration_parts): quantile q is the middle of
-- the bucket holding the age of rank floor(q * (n - 1)), kept within the ages that bucket holds,
-- so within 0.5 % of 1 + that age (exact when the bucket holds one value).
with

parts as (
    select * from int_attr_calibration_parts
),

sums as (
    select
        case when grouping(replica) = 1 then 'router' else 'replica' end as scope,
        run_id,
        router_id,
        policy,
        replica,
        cast(sum(candidates) as bigint) as candidates,
        cast(sum(decisions) as bigint) as decisions,
        cast(sum(compared) as bigint) as compared,
        cast(sum(hits) as bigint) as hits,
        cast(sum(false_hits) as bigint) as false_hits,
        cast(sum(misses) as bigint) as misses,
        sum(abs_error_tokens) / nullif(sum(compared), 0) as mean_abs_error_tokens,
        sum(error_tokens) / nullif(sum(compared), 0) as mean_error_tokens,
        sum(predicted_tokens) as predicted_tokens,
        sum(actual_tokens) as actual_tokens,
        max(telemetry_age_max_ms) as telemetry_age_max_ms,
        sum(reconstructed) / sum(candidates) as reconstructed_share
    from parts
    group by grouping sets (
        (run_id, router_id, policy, replica),
        (run_id, router_id, policy)
    )
),

bucket_rows as (
    select
        run_id,
        router_id,
        policy,
        replica,
        unnest(age_histogram) as h
    from parts
),

buckets as (
    select
        case when grouping(replica) = 1 then 'router' else 'replica' end as scope,
        run_id,
        router_id,
        policy,
        replica,
        h.bucket,
        sum(h.n) as n,
        min(h.lo) as lo,
        max(h.hi) as hi
    from bucket_rows
    group by grouping sets (
        (run_id, router_id, policy, replica, h.bucket),
        (run_id, router_id, policy, h.bucket)
    )
),

ranked as (
    select
        *,
        sum(n) over (
            partition by scope, run_id, router_id, policy, replica
            order by bucket
            rows between unbounded preceding and current row
        ) as upto,
        sum(n) over (partition by scope, run_id, router_id, policy, replica) as total,
        -- the bucket's middle, within the ages it holds (exact when they are all one value)
        least(greatest(
            case
                when bucket >= 0 then exp((bucket + 0.5) * ln(1.01)) - 1
                else 1 - exp((-bucket - 0.5) * ln(1.01))
            end, lo), hi) as age_ms
    from buckets
),

quantiles as (
    -- the bucket holding the value of 0-based rank floor(q * (total - 1))
    select
        scope,
        run_id,
        router_id,
        policy,
        replica,
        arg_min(age_ms, bucket) filter (where upto > floor(0.5 * (total - 1)))
            as telemetry_age_p50_ms,
        arg_min(age_ms, bucket) filter (where upto > floor(0.9 * (total - 1)))
            as telemetry_age_p90_ms,
        arg_min(age_ms, bucket) filter (where upto > floor(0.99 * (total - 1)))
            as telemetry_age_p99_ms
    from ranked
    group by scope, run_id, router_id, policy, replica
),

final as (
    select
        s.scope,
        s.run_id,
        s.router_id,
        s.policy,
        s.replica,
        s.candidates,
        s.decisions,
        s.compared,
        s.hits,
        s.false_hits,
        s.misses,
        s.mean_abs_error_tokens,
        s.mean_error_tokens,
        s.predicted_tokens,
        s.actual_tokens,
        q.telemetry_age_p50_ms,
        q.telemetry_age_p90_ms,
        q.telemetry_age_p99_ms,
        s.telemetry_age_max_ms,
        s.reconstructed_share
    from sums as s
    left join quantiles as q
        on
            s.scope = q.scope
            and s.run_id is not distinct from q.run_id
            and s.router_id is not distinct from q.router_id
            and s.policy is not distinct from q.policy
            and s.replica is not distinct from q.replica
)

select * from final
