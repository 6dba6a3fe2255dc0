-- decisions: one row per routing attempt of a request, and decision_id is unique.
select request_key, cast(attempt as varchar) as attempt, count(*) as row_count
from decisions
group by request_key, attempt
having count(*) > 1

union all

select decision_id as request_key, 'decision_id' as attempt, count(*) as row_count
from decisions
group by decision_id
having count(*) > 1
