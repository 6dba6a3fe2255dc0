-- int_attr_client_gaps: one row per run: the client-minus-replica TTFT gap a request of the run
-- normally has (median over its successful requests seen by both the client and the replica).
-- It depends on no session variable, so it is a table, and a live computation scoped to some
-- requests (routeaudit_scope_request) still compares them with their whole run.
with

all_requests as (
    select * from requests
),

measured as (
    -- as int_attr_requests_judged measures them: no status is ok, no TTFT means the latency
    select distinct
        request_key,
        run_id,
        coalesce(ttft_ms, e2e_ms) as ttft_ms,
        replica_ttft_ms
    from all_requests
    where
        has_client
        and replica_ttft_ms is not null
        and coalesce(status, 'ok') = 'ok'
),

final as (
    select
        run_id,
        median(ttft_ms - replica_ttft_ms) as run_gap_p50_ms
    from measured
    group by all
)

select * from final
