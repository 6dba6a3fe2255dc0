-- int_attr_candidates_resolved: one row per candidate replica per decision: what the router
-- saw. Recorded decisions use their candidate events (evidence_source 'recorded'). Decisions
-- without candidate events (third-party routers, recorded = false) are given every replica of
-- the run (from executions and the chosen replica) with the telemetry the router could at best
-- have seen: the latest successful scrape at or before the decision, and its age
-- (evidence_source 'reconstructed'; eligibility, pending and cache predictions unknown).
with

resolved_decisions as (
    select * from int_attr_decisions_resolved
),

all_candidates as (
    select * from candidates
),

all_snapshots as (
    select * from snapshots
),

timed as (
    select * from int_attr_executions_timed
),

recorded as (
    select
        d.request_id,
        d.attempt,
        d.span_id as decision_span_id,
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
        c.est_queue_ms,
        c.est_prefill_ms,
        c.score,
        'recorded' as evidence_source
    from resolved_decisions as d
    inner join all_candidates as c
        on d.request_id = c.request_id
        and d.attempt is not distinct from c.attempt
        and (
            c.decision_span_id is null
            or d.span_id is null
            or c.decision_span_id = d.span_id
        )
),

unrecorded_decisions as (
    select d.*
    from resolved_decisions as d
    anti join recorded as c
        on d.request_id = c.request_id
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
    -- one engine's scrape per dp rank: add the ranks of one replica at one instant
    select
        replica,
        scraped_at,
        sum(waiting) as waiting,
        sum(running) as running,
        max(kv_usage) as kv_usage
    from all_snapshots
    where coalesce(ok, true)
    group by all
),

reconstructed_pairs as (
    select
        d.request_id,
        d.attempt,
        d.span_id as decision_span_id,
        d.decided_at,
        d.chosen_replica,
        x.replica
    from unrecorded_decisions as d
    inner join run_replicas as x
        on d.run_id is not distinct from x.run_id
    union
    select
        d.request_id,
        d.attempt,
        d.span_id as decision_span_id,
        d.decided_at,
        d.chosen_replica,
        d.chosen_replica as replica
    from unrecorded_decisions as d
    where d.chosen_replica is not null
),

reconstructed as (
    select
        p.request_id,
        p.attempt,
        p.decision_span_id,
        p.replica,
        true as eligible,
        cast(null as varchar) as excluded_reason,
        p.replica is not distinct from p.chosen_replica as chosen,
        s.waiting as seen_waiting,
        s.running as seen_running,
        s.kv_usage as seen_kv_usage,
        cast(null as bigint) as seen_remaining_tokens,
        cast(null as bigint) as seen_pending,
        s.scraped_at as telemetry_ts,
        date_diff('microsecond', s.scraped_at, p.decided_at) / 1000.0
            as telemetry_age_ms,
        cast(null as bigint) as predicted_cached_tokens,
        cast(null as double) as est_queue_ms,
        cast(null as double) as est_prefill_ms,
        cast(null as double) as score,
        'reconstructed' as evidence_source
    from reconstructed_pairs as p
    asof left join scrapes as s
        on p.replica = s.replica
        and p.decided_at >= s.scraped_at
),

final as (
    select * from recorded
    union all by name
    select * from reconstructed
)

select * from final
