-- requests: status is one of the documented values; link_method too.
select *
from requests
where status not in ('ok', 'error', 'timeout', 'cancelled', 'rejected')
    or link_method not in ('trace', 'request_id', 'none')
