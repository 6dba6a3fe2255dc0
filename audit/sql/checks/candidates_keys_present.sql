-- candidates: every candidate belongs to a decision of its request (the attribution layer joins
-- them by request_key and attempt: request ids repeat).
select candidates.*
from candidates
left join decisions
    on decisions.request_key = candidates.request_key
    and decisions.attempt is not distinct from candidates.attempt
where candidates.request_key is null
    or decisions.request_key is null
