-- int_attr_candidates_true_state: one row per candidate per decision (as
-- int_attr_candidates_resolved): the replica's TRUE state at the decision instant, rebuilt from
-- replica-side facts (executions of other requests on that replica, reference clock):
--   queued   = arrived (start_at <= t) and prefill not started (prefill_start_at > t)
--   running  = prefill started and not ended (prefill_start_at <= t < end)
--   remaining_tokens = uncached prefill still to do + decode still to do (the decode the
--     request actually produced, pro rata for what was left at t)
--   drain_ms = time from t until every request present at t had its first token: a request
--     arriving at t behind them (first come, first served) would start prefill then.
-- replica_observed is false when the store holds no execution and no scrape of the replica
-- (its state is unknown, not idle).
with

candidates_resolved as (
    select * from int_attr_candidates_resolved
),

resolved_decisions as (
    select * from int_attr_decisions_resolved
),

timed as (
    select * from int_attr_executions_timed
),

all_snapshots as (
    select * from snapshots
),

candidate_instants as (
    select
        c.*,
        d.run_id,
        d.decided_at,
        d.forward_delay_ms
    from candidates_resolved as c
    inner join resolved_decisions as d
        on c.request_id = d.request_id
        and c.attempt is not distinct from d.attempt
        and c.decision_span_id is not distinct from d.span_id
),

present_work as (
    select
        c.request_id,
        c.attempt,
        c.decision_span_id,
        c.replica,
        e.request_id as other_request_id,
        e.prefill_start_at > c.decided_at as is_queued,
        e.first_token_at,
        e.end_at_eff,
        e.uncached_tokens,
        coalesce(e.output_tokens, 0) as output_tokens,
        e.prefill_ms,
        c.decided_at,
        -- share of the prefill still to do at t (1 while queued)
        case
            when e.first_token_at <= c.decided_at then 0.0
            when e.prefill_start_at > c.decided_at then 1.0
            else date_diff('microsecond', c.decided_at, e.first_token_at)
                / greatest(
                    date_diff('microsecond', e.prefill_start_at, e.first_token_at),
                    1
                )
        end as prefill_left,
        -- share of the decode still to do at t
        case
            when e.first_token_at > c.decided_at then 1.0
            else date_diff('microsecond', c.decided_at, e.end_at_eff)
                / greatest(
                    date_diff('microsecond', e.first_token_at, e.end_at_eff), 1
                )
        end as decode_left
    from candidate_instants as c
    inner join timed as e
        on c.replica = e.replica
        and e.start_at <= c.decided_at
        and e.end_at_eff > c.decided_at
        and e.request_id is distinct from c.request_id
),

aggregated as (
    select
        request_id,
        attempt,
        decision_span_id,
        replica,
        count(*) filter (where is_queued) as true_waiting,
        count(*) filter (where not is_queued) as true_running,
        sum(uncached_tokens * prefill_left) as true_prefill_tokens_left,
        sum(
            uncached_tokens * prefill_left + output_tokens * decode_left
        ) as true_remaining_tokens,
        sum(uncached_tokens) filter (where is_queued) as true_queued_prefill_tokens,
        max(first_token_at) filter (where first_token_at > decided_at) as drained_at,
        any_value(decided_at) as decided_at
    from present_work
    group by all
),

observed_replicas as (
    select distinct replica from timed
    union
    select distinct replica from all_snapshots
),

final as (
    select
        c.request_id,
        c.attempt,
        c.decision_span_id,
        c.replica,
        c.run_id,
        c.decided_at,
        c.forward_delay_ms,
        o.replica is not null as replica_observed,
        coalesce(a.true_waiting, 0) as true_waiting,
        coalesce(a.true_running, 0) as true_running,
        coalesce(a.true_prefill_tokens_left, 0.0) as true_prefill_tokens_left,
        coalesce(a.true_remaining_tokens, 0.0) as true_remaining_tokens,
        coalesce(a.true_queued_prefill_tokens, 0) as true_queued_prefill_tokens,
        coalesce(
            date_diff('microsecond', c.decided_at, a.drained_at) / 1000.0, 0.0
        ) as drain_ms
    from candidate_instants as c
    left join aggregated as a
        on c.request_id = a.request_id
        and c.attempt is not distinct from a.attempt
        and c.decision_span_id is not distinct from a.decision_span_id
        and c.replica = a.replica
    left join observed_replicas as o
        on c.replica = o.replica
)

select * from final
