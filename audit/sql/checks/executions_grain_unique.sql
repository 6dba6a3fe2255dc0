-- executions: one row per replica span; cached <= input; ttft within e2e.
select trace_id, span_id, 'duplicate' as problem
from executions
group by trace_id, span_id
having count(*) > 1

union all

select trace_id, span_id, 'cached > input' as problem
from executions
where cached_tokens > input_tokens

union all

select trace_id, span_id, 'ttft > e2e' as problem
from executions
where ttft_ms > e2e_ms
