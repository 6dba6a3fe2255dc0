-- int_attr_decisions_resolved: one row per routing decision (grain: request_key, attempt,
-- decision span) with its run, whether it is the request's final attempt, and the execution it
-- led to: the request's first execution on the chosen replica that started after the decision
-- (1 s of clock tolerance), else its first at all. decision_key is a key of one integer, a
-- hash of the grain, that the candidate relations join on instead of the three columns of the
-- grain (two of them nullable, so compared with `is not distinct from`). A table, read many times by
-- int_attr_candidates_resolved and int_attr_candidates_state; DuckDB plans the in-flight range
-- join there as a linear IEJoin only when its inputs are table scans, not shared CTEs.
with

all_requests as (
    select distinct
        request_key,
        run_id
    from requests
),

all_decisions as (
    select * from decisions
),

timed as (
    select * from int_attr_executions_timed
),

decisions_ranked as (
    select
        d.*,
        j.run_id,
        -- same order as requests' final attempt, so one decision per request is final
        row_number() over (
            partition by d.request_key
            order by d.attempt desc, d.decided_ns desc nulls last, d.span_id desc nulls last
        ) = 1 as is_final
    from all_decisions as d
    left join (
        select request_key, any_value(run_id) as run_id
        from all_requests
        group by all
    ) as j
        on d.request_key = j.request_key
),

decisions_matched_executions as (
    -- the execution a decision led to: the request's first execution on the chosen replica
    -- that started after the decision (1 s of clock tolerance), else its first at all
    select
        d.request_key,
        d.attempt,
        d.span_id,
        e.span_id as exec_span_id,
        e.replica as exec_replica,
        e.start_at as exec_start_at,
        e.prefill_start_at as exec_prefill_start_at,
        e.first_token_at as exec_first_token_at,
        e.queue_ms_eff as exec_queue_ms,
        e.prefill_ms as exec_prefill_ms,
        e.ttft_ms_eff as exec_ttft_ms,
        e.input_tokens as exec_input_tokens,
        e.cached_tokens as exec_cached_tokens,
        e.uncached_tokens as exec_uncached_tokens,
        e.preemptions as exec_preemptions,
        row_number() over (
            partition by d.request_key, d.attempt, d.span_id
            order by
                (e.replica = d.chosen_replica) desc nulls last, e.start_at asc, e.span_id asc
        ) as preference
    from decisions_ranked as d
    inner join timed as e
        on d.request_key = e.request_key
        and e.start_at >= d.decided_at - interval 1 second
),

final as (
    select
        -- a hash of the grain, computed from the row alone, so that every reference of the
        -- relation as a view gives the same keys (a read-only reader of a store from another
        -- version installs the relations as views) and a new decision leaves the others' keys
        -- alone (docs/architecture.md, "Always-on analysis"); numbering the rows over the whole table cost as
        -- much (a sort of every decision). 125 bits: collisions are negligible, and a hugeint
        -- that small fits the 38 digits of the decimal Arrow carries it in, so every reader
        -- sees the stored value (a uhugeint above 10^38 would come out wrapped). '-' stands
        -- for null: neither an attempt number nor a hex span id.
        cast(
            md5_number(
                d.request_key || '|' || coalesce(cast(d.attempt as varchar), '-') || '|'
                || coalesce(d.span_id, '-')
            ) >> 3 as hugeint
        ) as decision_key,
        d.request_key,
        d.request_id,
        d.attempt,
        d.span_id as decision_span_id,
        d.router_id,
        d.policy,
        d.decided_at,
        d.chosen_replica,
        d.reason as decision_reason,
        d.outcome as decision_outcome,
        d.recorded,
        d.run_id,
        d.is_final,
        m.* exclude (request_key, attempt, span_id, preference),
        greatest(
            coalesce(
                date_diff('microsecond', d.decided_at, m.exec_start_at) / 1000.0,
                0.0
            ),
            0.0
        ) as forward_delay_ms
    from decisions_ranked as d
    left join decisions_matched_executions as m
        on d.request_key = m.request_key
        and d.attempt is not distinct from m.attempt
        and d.span_id is not distinct from m.span_id
        and m.preference = 1
)

select * from final
