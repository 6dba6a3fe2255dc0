-- slow_requests: the grain is one row per request_key, and each is in attributions.
select
    slow_requests.request_key,
    count(*) as row_count
from slow_requests
left join attributions
    on
        slow_requests.request_key = attributions.request_key
        and attributions.is_primary
group by slow_requests.request_key
having count(*) > 1 or count(attributions.request_key) = 0
