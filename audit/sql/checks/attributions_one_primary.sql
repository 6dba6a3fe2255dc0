-- attributions: every request explained has exactly one primary cause.
select
    request_key,
    count(*) filter (where is_primary) as primary_count
from attributions
group by request_key
having count(*) filter (where is_primary) <> 1
