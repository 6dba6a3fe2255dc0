-- requests: tpot_ms is null when fewer than 2 output tokens were produced.
select *
from requests
where tpot_ms is not null and (output_tokens is null or output_tokens < 2)
