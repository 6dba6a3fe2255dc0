-- int_attr_candidates_resolved: one row per candidate replica per decision (grain: request_key,
-- attempt, decision_span_id, replica; decision_key stands for the decision): what the router
-- recorded about the candidate or, for a decision recorded without candidates, every replica of
-- its run (evidence_source says which). A reconstructed candidate's view is the deciding
-- router's own /metrics row about the worker when there is one (int_attr_candidates_router_view:
-- seen_pending = the router's requests in flight there, the engine load it re-exports, the
-- row's time and age), else the engines' last scrape at or before the decision. Either is what
-- the router saw or could have seen, never the replica's true state.
-- pending_total: the sum of the recorded candidates' pending counts of the decision; a router
-- counts its own assignments not yet in telemetry, so within one instant the smaller total was
-- decided first.
with

decisions_resolved as (
    select * from int_attr_decisions_resolved
),

all_candidates as (
    select * from candidates
),

timed as (
    select * from int_attr_executions_timed
),

candidates_recorded as (
    select
        d.decision_key,
        d.request_key,
        d.attempt,
        d.decision_span_id,
        c.replica,
        coalesce(c.eligible, true) as eligible,
        c.excluded_reason,
        coalesce(c.chosen, c.replica = d.chosen_replica, false) as chosen,
        cast(c.waiting as double) as seen_waiting,
        cast(c.running as double) as seen_running,
        c.kv_usage as seen_kv_usage,
        c.remaining_tokens as seen_remaining_tokens,
        c.pending as seen_pending,
        c.telemetry_ts,
        coalesce(
            c.telemetry_age_ms,
            date_diff('microsecond', c.telemetry_ts, d.decided_at) / 1000.0
        ) as telemetry_age_ms,
        c.predicted_cached_tokens,
        c.est_queue_ms as router_est_queue_ms,
        c.est_prefill_ms as router_est_prefill_ms,
        c.score,
        'recorded' as evidence_source
    from decisions_resolved as d
    inner join all_candidates as c
        on d.request_key = c.request_key
        and d.attempt is not distinct from c.attempt
        and (
            c.decision_span_id is null
            or d.decision_span_id is null
            or c.decision_span_id = d.decision_span_id
        )
),

decisions_unrecorded as (
    select d.*
    from decisions_resolved as d
    anti join candidates_recorded as c
        on d.request_key = c.request_key
        and d.attempt is not distinct from c.attempt
),

run_replicas as (
    select distinct
        run_id,
        replica
    from timed
    where replica is not null
),

scrapes as (
    select * from int_attr_replica_scrapes
),

router_view as (
    select * from int_attr_candidates_router_view
),

reconstructed_pairs as (
    select
        d.decision_key,
        d.request_key,
        d.attempt,
        d.decision_span_id,
        d.decided_at,
        d.chosen_replica,
        x.replica
    from decisions_unrecorded as d
    inner join run_replicas as x
        on d.run_id is not distinct from x.run_id
    union
    select
        d.decision_key,
        d.request_key,
        d.attempt,
        d.decision_span_id,
        d.decided_at,
        d.chosen_replica,
        d.chosen_replica as replica
    from decisions_unrecorded as d
    where d.chosen_replica is not null
),

candidates_reconstructed as (
    select
        p.decision_key,
        p.request_key,
        p.attempt,
        p.decision_span_id,
        p.replica,
        true as eligible,
        cast(null as varchar) as excluded_reason,
        (p.replica is not distinct from p.chosen_replica) as chosen,
        -- the router's own row, field by field as the router exposes it; else the engines'
        case when v.replica is null then s.waiting else v.waiting end as seen_waiting,
        case when v.replica is null then s.running else v.running end as seen_running,
        case when v.replica is null then s.kv_usage else v.kv_usage end as seen_kv_usage,
        cast(null as bigint) as seen_remaining_tokens,
        cast(round(v.router_in_flight) as bigint) as seen_pending,
        case when v.replica is null then s.scraped_at else v.view_ts end as telemetry_ts,
        case
            when v.replica is null
                then date_diff('microsecond', s.scraped_at, p.decided_at) / 1000.0
            else v.view_age_ms
        end as telemetry_age_ms,
        cast(null as bigint) as predicted_cached_tokens,
        cast(null as double) as router_est_queue_ms,
        cast(null as double) as router_est_prefill_ms,
        cast(null as double) as score,
        'reconstructed' as evidence_source
    from reconstructed_pairs as p
    asof left join scrapes as s
        on p.replica = s.replica
        and p.decided_at >= s.scraped_at
    left join router_view as v
        on p.decision_key = v.decision_key
        and p.replica = v.replica
),

candidates_resolved as (
    select * from candidates_recorded
    union all by name
    select * from candidates_reconstructed
),

final as (
    select
        *,
        sum(seen_pending) filter (where evidence_source = 'recorded') over (
            partition by decision_key
        ) as pending_total
    from candidates_resolved
)

select * from final
