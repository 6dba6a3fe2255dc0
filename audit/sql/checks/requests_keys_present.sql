-- requests: every row has its key and a trace. request_id may be null only when no side
-- carried any id (e.g. a bare replica span); a request with a client side always has one.
select *
from requests
where request_key is null
    or trace_id is null
    or (has_client and request_id is null)
