-- executions: every execution belongs to a request that exists (the attribution layer joins
-- executions to their request by request_key only: request ids repeat).
select executions.*
from executions
left join requests
    on requests.request_key = executions.request_key
where executions.request_key is null
    or requests.request_key is null
