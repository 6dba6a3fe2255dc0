-- int_attr_client_gaps: one row per (partition, run): the client-minus-replica TTFT gap a
-- request of the run normally has (median over its successful requests seen by both the client
-- and the replica), for partition p over the run's requests in partitions
-- p - window_partitions .. p (stg_partitioning), so a later partition never moves it. Rows exist
-- for the partitions holding requests of the run. It depends on no session variable, so it is
-- a table, and a live computation scoped to some requests (routeaudit_scope_request) still
-- compares them with their run's window.
with

all_requests as (
    select * from requests
),

window_offsets as (
    -- a request counts in the window of its own partition and of the next
    -- window_partitions ones: shifting it by each offset makes the windows an equi-join
    select unnest(range(window_partitions + 1)) as partitions_later
    from stg_partitioning
),

run_partitions as (
    select distinct
        run_id,
        part
    from all_requests
),

measured as (
    -- as int_attr_requests_judged measures them: no status is ok, no TTFT means the latency
    select distinct
        request_key,
        run_id,
        part,
        coalesce(ttft_ms, e2e_ms) as ttft_ms,
        replica_ttft_ms
    from all_requests
    where
        has_client
        and replica_ttft_ms is not null
        and coalesce(status, 'ok') = 'ok'
),

windowed as (
    select
        w.part,
        w.run_id,
        m.ttft_ms - m.replica_ttft_ms as gap_ms
    from measured as m
    cross join window_offsets as o
    inner join run_partitions as w
        on m.part + o.partitions_later = w.part
        and m.run_id is not distinct from w.run_id
),

final as (
    select
        part,
        run_id,
        median(gap_ms) as run_gap_p50_ms
    from windowed
    group by all
)

select * from final
