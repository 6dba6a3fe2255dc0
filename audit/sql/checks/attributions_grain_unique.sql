-- attributions: the grain is one row per cause (and sub-kind) per request.
select
    request_key,
    cause,
    sub_kind,
    count(*) as row_count
from attributions
group by request_key, cause, sub_kind
having count(*) > 1
