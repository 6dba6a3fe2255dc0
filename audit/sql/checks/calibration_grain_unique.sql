-- calibration: one row per (scope, run, router, policy, replica); a router row has no replica.
select
    scope,
    run_id,
    router_id,
    policy,
    replica,
    count(*) as row_count
from calibration
group by scope, run_id, router_id, policy, replica
having
    count(*) > 1
    or any_value(scope = 'router' and replica is not null)
    or any_value(hits + false_hits > decisions)
