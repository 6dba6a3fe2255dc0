-- decisions: every attempt belongs to a request that exists.
select decisions.*
from decisions
left join requests
    on requests.request_key = decisions.request_key
where decisions.request_key is null
    or decisions.attempt is null
    or requests.request_key is null
