-- requests: every row has its key, a trace and a request id.
select *
from requests
where request_key is null or trace_id is null or request_id is null
