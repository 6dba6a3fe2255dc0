-- requests: the grain is one row per request_key.
select request_key, count(*) as row_count
from requests
group by request_key
having count(*) > 1
