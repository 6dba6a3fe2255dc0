-- requests: cached prompt tokens never exceed prompt tokens.
select *
from requests
where actual_cached_tokens > input_tokens
