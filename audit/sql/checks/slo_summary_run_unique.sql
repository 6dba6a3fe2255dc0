-- slo_summary: the grain is one row per run_id (null included); its counts add up.
select
    run_id,
    count(*) as row_count
from slo_summary
group by run_id
having
    count(*) > 1
    or any_value(goodput + slow) <> any_value(ok)
    or any_value(ok + timeouts + rejected + errors + cancelled + other_status)
    <> any_value(requests)
