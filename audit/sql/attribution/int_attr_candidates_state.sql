-- int_attr_candidates_state: one row per candidate replica per routing decision (plus one row
-- for a request with no decision, or a decision with no candidate): the decision, what the
-- router saw, and the candidate's TRUE state at the decision instant rebuilt from executions.
-- Everything here is independent of the SLO and of the attribution thresholds, so it is a
-- materialised table; int_attr_candidates_assessed (a view) adds the SLO judgement, the
-- calibration choice, the estimates and the threshold-dependent evidence on top. Every mart is
-- read once. docs/attribution.md has the formulas.
with

all_requests as (
    select distinct
        request_id,
        run_id,
        input_tokens
    from requests
),

timed_executions as (
    select * from int_attr_executions_timed
),

all_decisions as (
    select * from decisions
),

all_candidates as (
    select * from candidates
),

all_snapshots as (
    select * from snapshots
),

decision_prefixes as (
    select
        a_request_id as request_id,
        coalesce(a_attempt, 0) as attempt,
        any_value(a_prefix_hashes) as prefix_hashes
    from raw_spans
    where
        name = 'routeaudit.decision'
        and a_request_id is not null
        and len(a_prefix_hashes) > 0
    group by all
),
timed as (
    select
        e.*,
        r.run_id
    from timed_executions as e
    left join (
        select request_id, any_value(run_id) as run_id from all_requests group by all
    ) as r
        on e.request_id = r.request_id
),

decisions_ranked as (
    select
        d.*,
        j.run_id,
        d.attempt = max(d.attempt) over (partition by d.request_id) as is_final
    from all_decisions as d
    left join (
        select request_id, any_value(run_id) as run_id from all_requests group by all
    ) as j
        on d.request_id = j.request_id
),
decisions_matched_executions as (
    -- the execution a decision led to: the request's first execution on the chosen replica
    -- that started after the decision (1 s of clock tolerance), else its first at all
    select
        d.request_id,
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
            partition by d.request_id, d.attempt, d.span_id
            order by
                (e.replica = d.chosen_replica) desc nulls last, e.start_at asc
        ) as preference
    from decisions_ranked as d
    inner join timed as e
        on d.request_id = e.request_id
        and e.start_at >= d.decided_at - interval 1 second
),
decisions_resolved as (
    select
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
        m.* exclude (request_id, attempt, span_id, preference),
        greatest(
            coalesce(
                date_diff('microsecond', d.decided_at, m.exec_start_at) / 1000.0,
                0.0
            ),
            0.0
        ) as forward_delay_ms
    from decisions_ranked as d
    left join decisions_matched_executions as m
        on d.request_id = m.request_id
        and d.attempt is not distinct from m.attempt
        and d.span_id is not distinct from m.span_id
        and m.preference = 1
),
candidates_recorded as (
    select
        d.request_id,
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
        on d.request_id = c.request_id
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
    -- one scrape holds one row per dp rank: add the ranks of a replica at one instant
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
        d.decision_span_id,
        d.decided_at,
        d.chosen_replica,
        x.replica
    from decisions_unrecorded as d
    inner join run_replicas as x
        on d.run_id is not distinct from x.run_id
    union
    select
        d.request_id,
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
        cast(null as double) as router_est_queue_ms,
        cast(null as double) as router_est_prefill_ms,
        cast(null as double) as score,
        'reconstructed' as evidence_source
    from reconstructed_pairs as p
    asof left join scrapes as s
        on p.replica = s.replica
        and p.decided_at >= s.scraped_at
),
candidates_resolved as (
    select * from candidates_recorded
    union all by name
    select * from candidates_reconstructed
),
decision_order as (
    -- a router counts its own assignments not yet in telemetry (pending): within one instant
    -- each decision adds one, so the sum over its candidates orders same-instant decisions
    select
        d.request_id,
        d.attempt,
        d.decision_span_id,
        any_value(d.router_id) as router_id,
        any_value(d.is_final) as is_final,
        sum(c.seen_pending) as pending_total
    from decisions_resolved as d
    inner join candidates_recorded as c
        on d.request_id = c.request_id
        and d.attempt is not distinct from c.attempt
        and d.decision_span_id is not distinct from c.decision_span_id
    group by all
),
timed_ordered as (
    select
        e.*,
        o.router_id as e_router_id,
        o.pending_total as e_pending_total
    from timed as e
    left join (
        select * from decision_order where is_final
    ) as o
        on e.request_id = o.request_id
),
candidate_instants as (
    select
        c.request_id,
        c.attempt,
        c.decision_span_id,
        c.replica,
        d.decided_at,
        d.router_id,
        o.pending_total,
        d.exec_replica,
        d.exec_prefill_start_at
    from candidates_resolved as c
    inner join decisions_resolved as d
        on c.request_id = d.request_id
        and c.attempt is not distinct from d.attempt
        and c.decision_span_id is not distinct from d.decision_span_id
    left join decision_order as o
        on c.request_id = o.request_id
        and c.attempt is not distinct from o.attempt
        and c.decision_span_id is not distinct from o.decision_span_id
),
present_work as (
    -- other requests on the candidate replica at t: arrived before t and not finished. One
    -- that arrived at the very instant t was decided before or after this one (coarse clocks
    -- and batched arrivals make such ties common): when the same router decided both with
    -- different pending totals, the smaller came first; else, on the replica that ran this
    -- request, it came first when its prefill started first (FCFS); else it counts
    select
        c.request_id,
        c.attempt,
        c.decision_span_id,
        c.replica,
        c.decided_at,
        e.prefill_start_at > c.decided_at as is_queued,
        e.first_token_at,
        e.uncached_tokens,
        coalesce(e.output_tokens, 0) as output_tokens,
        case
            when e.first_token_at <= c.decided_at then 0.0
            when e.prefill_start_at > c.decided_at then 1.0
            else date_diff('microsecond', c.decided_at, e.first_token_at)
                / greatest(
                    date_diff('microsecond', e.prefill_start_at, e.first_token_at),
                    1
                )
        end as prefill_left,
        case
            when e.first_token_at > c.decided_at then 1.0
            else date_diff('microsecond', c.decided_at, e.end_at_eff)
                / greatest(
                    date_diff('microsecond', e.first_token_at, e.end_at_eff), 1
                )
        end as decode_left
    from candidate_instants as c
    inner join timed_ordered as e
        on c.replica = e.replica
        and e.start_at <= c.decided_at
        and e.end_at_eff > c.decided_at
        and e.request_id is distinct from c.request_id
        and (
            e.start_at < c.decided_at
            or case
                when e.e_router_id = c.router_id
                    and e.e_pending_total <> c.pending_total
                    then e.e_pending_total < c.pending_total
                when c.replica = c.exec_replica
                    then e.prefill_start_at < c.exec_prefill_start_at
                else true
            end
        )
),
true_state_aggregated as (
    select
        request_id,
        attempt,
        decision_span_id,
        replica,
        count(*) filter (where is_queued) as true_waiting,
        count(*) filter (where not is_queued) as true_running,
        sum(uncached_tokens * prefill_left + output_tokens * decode_left)
            as true_remaining_tokens,
        sum(uncached_tokens) filter (where is_queued)
            as true_queued_prefill_tokens,
        max(date_diff('microsecond', decided_at, first_token_at) / 1000.0)
            filter (where first_token_at > decided_at) as drain_ms
    from present_work
    group by all
),
observed_replicas as (
    select distinct replica from timed
    union
    select distinct replica from all_snapshots
),
candidates_with_state as (
    select
        c.*,
        o.replica is not null as replica_observed,
        coalesce(s.true_waiting, 0) as true_waiting,
        coalesce(s.true_running, 0) as true_running,
        coalesce(s.true_remaining_tokens, 0.0) as true_remaining_tokens,
        coalesce(s.true_queued_prefill_tokens, 0) as true_queued_prefill_tokens,
        coalesce(s.drain_ms, 0.0) as drain_ms,
        -- cache the request would have found there: the replica's report where it ran,
        -- else the router's prediction (0 when the router predicted nothing)
        case
            when c.replica = d.exec_replica and d.exec_cached_tokens is not null
                then d.exec_cached_tokens
            else least(
                coalesce(c.predicted_cached_tokens, 0),
                coalesce(r.input_tokens, c.predicted_cached_tokens, 0)
            )
        end as cached_assumed_tokens,
        -- FCFS: it would start prefill once the work present at t had its first token
        greatest(coalesce(s.drain_ms, 0.0) - d.forward_delay_ms, 0.0) as wait_est_ms
    from candidates_resolved as c
    inner join decisions_resolved as d
        on c.request_id = d.request_id
        and c.attempt is not distinct from d.attempt
        and c.decision_span_id is not distinct from d.decision_span_id
    left join true_state_aggregated as s
        on c.request_id = s.request_id
        and c.attempt is not distinct from s.attempt
        and c.decision_span_id is not distinct from s.decision_span_id
        and c.replica = s.replica
    left join observed_replicas as o
        on c.replica = o.replica
    left join (
        select request_id, max(input_tokens) as input_tokens from all_requests group by all
    ) as r
        on c.request_id = r.request_id
),

chosen_telemetry as (
    select
        c.request_id,
        c.attempt,
        c.decision_span_id,
        d.run_id,
        d.decided_at,
        d.chosen_replica,
        d.router_id,
        c.telemetry_ts,
        coalesce(c.seen_pending, 0) as seen_pending
    from candidates_resolved as c
    inner join decisions_resolved as d
        on c.request_id = d.request_id
        and c.attempt is not distinct from d.attempt
        and c.decision_span_id is not distinct from d.decision_span_id
    where c.chosen and c.telemetry_ts is not null
),
herding_ranked as (
    -- decisions onto one replica made on one telemetry sample of it
    select
        *,
        row_number() over episode as episode_rank,
        count(*) over (
            partition by run_id, chosen_replica, telemetry_ts
        ) as episode_decisions
    from chosen_telemetry
    window episode as (
        partition by run_id, chosen_replica, telemetry_ts
        order by decided_at, request_id, attempt
    )
),
herding_members as (
    select
        *,
        -- earlier assignments in the episode that the router's pending did not count
        greatest(episode_rank - 1 - seen_pending, 0) as unreflected_assignments,
        sum(greatest(episode_rank - 1 - seen_pending, 0)) over (
            partition by run_id, chosen_replica, telemetry_ts
        ) as episode_unreflected
    from herding_ranked
),
preemptions_nearby as (
    -- other requests on the chosen replica preempted while this one waited
    select
        d.request_id,
        d.attempt,
        d.decision_span_id,
        sum(e.preemptions) as preemptions_nearby
    from decisions_resolved as d
    inner join timed as e
        on d.chosen_replica = e.replica
        and e.request_id <> d.request_id
        and e.start_at <= coalesce(d.exec_prefill_start_at, d.decided_at)
        and e.end_at_eff >= d.decided_at
        and e.preemptions > 0
    group by all
),
served_blocks as (
    -- every prefix block a replica prefilled, stamped with the request's first token
    select
        e.replica,
        unnest(q.prefix_hashes) as block_hash,
        e.first_token_at as served_at
    from timed as e
    inner join decision_prefixes as q
        on e.request_id = q.request_id
    where e.first_token_at is not null
),
decision_blocks as (
    select
        d.request_id,
        d.attempt,
        d.decision_span_id,
        d.chosen_replica,
        coalesce(d.exec_prefill_start_at, d.decided_at) as needed_at,
        len(p.prefix_hashes) as n_blocks,
        unnest(p.prefix_hashes) as block_hash
    from decisions_resolved as d
    inner join decision_prefixes as p
        on d.request_id = p.request_id
        and coalesce(d.attempt, 0) = p.attempt
    where d.chosen_replica is not null
),
decision_blocks_served as (
    -- the last time the chosen replica served each block before this prefill started
    select
        b.*,
        s.served_at
    from decision_blocks as b
    asof left join served_blocks as s
        on b.chosen_replica = s.replica
        and b.block_hash = s.block_hash
        and b.needed_at >= s.served_at
),
prefix_served as (
    -- earlier requests sharing prefix blocks with this one were prefilled on the chosen replica
    -- before this prefill: the replica held (part of) the prefix. Block hashes are chained, so
    -- the blocks found form a prefix and their count is the longest shared prefix. Looking back
    -- at most 300 s; the lookback threshold is applied on top in int_attr_candidates_assessed.
    select
        request_id,
        attempt,
        decision_span_id,
        max(served_at) as prefix_last_served_at,
        count(served_at) as prefix_shared_blocks,
        count(served_at) / any_value(n_blocks) as prefix_shared_frac
    from decision_blocks_served
    where served_at >= needed_at - interval 300 second
    group by all
),
decisions_evidenced as (
    select
        d.*,
        h.telemetry_ts as chosen_telemetry_ts,
        h.episode_rank,
        h.episode_decisions,
        h.unreflected_assignments,
        h.episode_unreflected,
        coalesce(n.preemptions_nearby, 0) as preemptions_nearby,
        p.request_id is not null as has_prefix_hashes,
        s.prefix_last_served_at,
        s.prefix_shared_blocks,
        s.prefix_shared_frac
    from decisions_resolved as d
    left join herding_members as h
        on d.request_id = h.request_id
        and d.attempt is not distinct from h.attempt
        and d.decision_span_id is not distinct from h.decision_span_id
    left join preemptions_nearby as n
        on d.request_id = n.request_id
        and d.attempt is not distinct from n.attempt
        and d.decision_span_id is not distinct from n.decision_span_id
    left join decision_prefixes as p
        on d.request_id = p.request_id
        and coalesce(d.attempt, 0) = p.attempt
    left join prefix_served as s
        on d.request_id = s.request_id
        and d.attempt is not distinct from s.attempt
        and d.decision_span_id is not distinct from s.decision_span_id
),

final as (
    select
        r.request_id,
        d.* exclude (request_id, run_id, router_id, policy, chosen_replica),
        d.router_id as decision_router_id,
        d.policy as decision_policy,
        d.chosen_replica as decision_replica,
        c.* exclude (request_id, attempt, decision_span_id)
    from (select distinct request_id from all_requests) as r
    left join decisions_evidenced as d
        on r.request_id = d.request_id
    left join candidates_with_state as c
        on d.request_id = c.request_id
        and d.attempt is not distinct from c.attempt
        and d.decision_span_id is not distinct from c.decision_span_id
)

select * from final
