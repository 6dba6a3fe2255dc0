-- int_attr_decisions_resolved: one row per decision (decisions mart), with its run, whether it
-- is the request's final attempt, the execution it led to (the request's execution on the
-- chosen replica, else its first execution after the decision) and the forward delay (decision to arrival).
with

all_decisions as materialized (
    select * from decisions
),

all_requests as materialized (
    select * from requests
),

timed as materialized (
    select * from int_attr_executions_timed
),

ranked_decisions as (
    select
        d.*,
        r.run_id,
        r.input_tokens as request_input_tokens,
        d.attempt = max(d.attempt) over (partition by d.request_id) as is_final
    from all_decisions as d
    left join all_requests as r
        on d.request_id = r.request_id
),

matched_executions as (
    select
        d.request_id,
        d.attempt,
        d.span_id,
        e.span_id as execution_span_id,
        e.replica as execution_replica,
        e.start_at as execution_start_at,
        row_number() over (
            partition by d.request_id, d.attempt, d.span_id
            order by (e.replica = d.chosen_replica) desc, e.start_at asc
        ) as preference
    from ranked_decisions as d
    inner join timed as e
        on d.request_id = e.request_id
        and e.start_at >= d.decided_at - interval 1 second
),

final as (
    select
        d.*,
        m.execution_span_id,
        m.execution_replica,
        greatest(
            coalesce(
                date_diff('microsecond', d.decided_at, m.execution_start_at)
                / 1000.0,
                0.0
            ),
            0.0
        ) as forward_delay_ms
    from ranked_decisions as d
    left join matched_executions as m
        on d.request_id = m.request_id
        and d.attempt is not distinct from m.attempt
        and d.span_id is not distinct from m.span_id
        and m.preference = 1
)

select * from final
