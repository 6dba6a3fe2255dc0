-- int_attr_idle_prefills: one row per execution (request_key, span_id: a span id alone is unique
-- only within its trace) whose prefill ran alone: the chosen
-- replica had no request queued or in prefill at the decision (drain 0), and no other request's
-- prefill on that replica overlapped its prefill. These calibrate what a prompt costs on an idle
-- replica (int_attr_replica_fits). The overlap is found by one pass over each replica's
-- prefills in start order, not by joining prefills to prefills: a range join is quadratic in a
-- replica's history on an engine that cannot plan it as an interval join (Spark), and two
-- window functions over one sort are linear on both.
with

idle_starts as (
    select distinct
        request_key,
        exec_span_id as span_id
    from int_attr_candidates_state
    where
        chosen
        and replica = exec_replica
        and drain_ms = 0
        and exec_span_id is not null
),

prefills_in_order as (
    -- each replica's prefills (both instants known, the first token not before the start) in
    -- start order, with the latest first token of those before it in that order and the start
    -- of the next. Two prefills overlap when each starts before the other's first token: one
    -- that started earlier overlaps this one iff its first token came after this one's start,
    -- and a later one iff it started before this one's first token, the next one first
    select
        request_key,
        span_id,
        prefill_start_at,
        first_token_at,
        max(first_token_at) over (
            partition by replica
            order by prefill_start_at, request_key, span_id
            rows between unbounded preceding and 1 preceding
        ) as earlier_first_token_at,
        lead(prefill_start_at) over (
            partition by replica
            order by prefill_start_at, request_key, span_id
        ) as next_prefill_start_at
    from int_attr_executions_timed
    where
        prefill_start_at is not null
        and first_token_at >= prefill_start_at
),

final as (
    -- an execution without both instants has no prefill to share: nothing overlaps it
    select distinct
        e.request_key,
        e.span_id
    from int_attr_executions_timed as e
    semi join idle_starts as i
        on e.request_key = i.request_key
        and e.span_id = i.span_id
    left join prefills_in_order as p
        on e.request_key = p.request_key
        and e.span_id = p.span_id
    where
        not coalesce(
            p.earlier_first_token_at > p.prefill_start_at
            or p.next_prefill_start_at < p.first_token_at,
            false
        )
)

select * from final
