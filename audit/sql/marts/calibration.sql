-- calibration: how well routers' views matched the replicas. One row per
-- (run_id, router_id, policy, replica) with scope 'replica', plus one per (run_id, router_id,
-- policy) with scope 'router' and replica null. Cache columns compare, for executed decisions,
-- the router's predicted cached tokens on the chosen replica with what the replica reported
-- (tolerance cache_tolerance_tokens): hits (prediction held), false_hits (predicted more than
-- was there), misses (a hit the router did not predict). Telemetry-age columns describe the
-- age of the telemetry behind every candidate the router scored.
with

assessed as (
    select * from int_attr_candidates_assessed
),

thresholds as (
    select * from int_attr_thresholds
),

candidate_rows as (
    select
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
        t.cache_tolerance_tokens as tol
    from assessed as a
    cross join thresholds as t
    where a.replica is not null
),

final as (
    select
        case when grouping(replica) = 1 then 'router' else 'replica' end as scope,
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
        avg(abs(predicted - actual)) filter (where chosen)
            as mean_abs_error_tokens,
        avg(predicted - actual) filter (where chosen) as mean_error_tokens,
        sum(predicted) filter (where chosen) as predicted_tokens,
        sum(actual) filter (where chosen and predicted is not null)
            as actual_tokens,
        quantile_cont(telemetry_age_ms, 0.5) as telemetry_age_p50_ms,
        quantile_cont(telemetry_age_ms, 0.9) as telemetry_age_p90_ms,
        quantile_cont(telemetry_age_ms, 0.99) as telemetry_age_p99_ms,
        max(telemetry_age_ms) as telemetry_age_max_ms,
        avg(case when evidence_source = 'reconstructed' then 1.0 else 0.0 end)
            as reconstructed_share
    from candidate_rows
    group by grouping sets (
        (run_id, router_id, policy, replica),
        (run_id, router_id, policy)
    )
)

select * from final
