-- requests: time to first token lies within the end-to-end latency, both non-negative.
select *
from requests
where ttft_ms > e2e_ms or ttft_ms < 0 or e2e_ms < 0
