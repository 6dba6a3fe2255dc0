-- int_attr_candidates_in_flight: the TRUE state of each candidate replica at its decision instant
-- (grain: decision_key, the decision's key in int_attr_decisions_resolved, and replica),
-- rebuilt from the executions in flight there: waiting and running counts, remaining tokens,
-- queued prefill tokens and the time until the last of them has its first token (drain).
-- Candidates with nothing in flight have no row. Its own relation, with no shared CTE: DuckDB
-- (2.0) plans a range join as an IEJoin, linear in its output, only in a query without
-- materialised CTEs; otherwise it falls back to a piecewise merge join that compares every pair
-- and grows quadratically with the store.
with

timed_ordered as (
    -- executions keyed for the range join below; each carries the router and pending total of
    -- its request's final decision (for same-instant ordering)
    select
        e.*,
        (cast(hash(e.replica) >> 2 as hugeint) << 64) + epoch_us(e.start_at) as start_key,
        (cast(hash(e.replica) >> 2 as hugeint) << 64) + epoch_us(e.end_at_eff) as end_key,
        o.router_id as e_router_id,
        o.pending_total as e_pending_total
    from int_attr_executions_timed as e
    left join (
        select
            d.request_key,
            any_value(d.router_id) as router_id,
            any_value(c.pending_total) as pending_total
        from int_attr_decisions_resolved as d
        inner join int_attr_candidates_resolved as c
            on d.decision_key = c.decision_key
        where d.is_final and c.evidence_source = 'recorded'
        group by d.decision_key, d.request_key
    ) as o
        on e.request_key = o.request_key
),

candidate_instants as (
    -- (replica, instant) as one orderable key: the replica's hash shifted above any microsecond
    -- timestamp, so the in-flight lookup is a pure range join (IEJoin, linear in its output)
    -- rather than a hash join on replica comparing every pair; present_work re-checks the
    -- replica, so a hash collision cannot mix replicas
    select
        c.decision_key,
        c.request_key,
        c.replica,
        d.decided_at,
        d.router_id,
        c.pending_total,
        d.exec_replica,
        d.exec_prefill_start_at,
        (cast(hash(c.replica) >> 2 as hugeint) << 64) + epoch_us(d.decided_at) as decided_key
    from int_attr_candidates_resolved as c
    inner join int_attr_decisions_resolved as d
        on c.decision_key = d.decision_key
    -- inside an incremental refresh's slice the candidates of requests anchored before
    -- context_from_ns are read by no row it computes: not looked up
    inner join requests as r
        on c.request_key = r.request_key
    cross join stg_partitioning as p
    where p.context_from_ns is null or r.anchor_ns >= p.context_from_ns
),

present_work as (
    -- other requests on the candidate replica at t: arrived before t and not finished. One
    -- that arrived at the very instant t was decided before or after this one (coarse clocks
    -- and batched arrivals make such ties common): when the same router decided both with
    -- different pending totals, the smaller came first; else, on the replica that ran this
    -- request, it came first when its prefill started first (FCFS); else, decided by the same
    -- router with nothing to order the two (a router without pending correction records no
    -- pending total), it does not count: nothing says it came first; else (another router's)
    -- it counts
    select
        c.decision_key,
        c.replica,
        c.decided_at,
        e.replica = c.replica as same_replica,
        e.prefill_start_at > c.decided_at as is_queued,
        e.first_token_at,
        e.uncached_tokens,
        -- on the replica that ran this request, a work whose first token came after this
        -- request's prefill started shared steps with the request's own chunks: its prefill
        -- tokens left at that start (the share of its prefill time still to run; all of them if
        -- it started later)
        case
            when e.replica = c.replica
                and c.replica = c.exec_replica
                and c.exec_prefill_start_at >= c.decided_at
                and e.first_token_at > c.exec_prefill_start_at
                then coalesce(e.uncached_tokens, 0) * case
                    when e.prefill_start_at >= c.exec_prefill_start_at then 1.0
                    else date_diff('microsecond', c.exec_prefill_start_at, e.first_token_at)
                        / greatest(
                            date_diff('microsecond', e.prefill_start_at, e.first_token_at), 1
                        )
                end
        end as shared_tokens,
        coalesce(e.output_tokens, 0) as output_tokens,
        coalesce(e.input_tokens, 0) as input_tokens,
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
        on e.start_key <= c.decided_key
        and e.end_key > c.decided_key
        and e.request_key is distinct from c.request_key
        and (
            e.start_at < c.decided_at
            or case
                when e.e_router_id = c.router_id
                    and e.e_pending_total <> c.pending_total
                    then e.e_pending_total < c.pending_total
                when c.replica = c.exec_replica
                    then e.prefill_start_at < c.exec_prefill_start_at
                when e.e_router_id = c.router_id
                    then false
                else true
            end
        )
),

final as (
    select
        decision_key,
        replica,
        count(*) filter (where same_replica and is_queued) as true_waiting,
        count(*) filter (where same_replica and not is_queued) as true_running,
        -- summed in thousandths of a token as integers: exact, so the same in any row order
        sum(
            cast(round((uncached_tokens * prefill_left + output_tokens * decode_left) * 1000)
                as bigint)
        ) filter (where same_replica) / 1000.0 as true_remaining_tokens,
        sum(uncached_tokens) filter (where same_replica and is_queued)
            as true_queued_prefill_tokens,
        sum(
            cast(round(input_tokens + output_tokens * (1.0 - decode_left)) as bigint)
        ) filter (where same_replica and not is_queued) as true_held_tokens,
        max(date_diff('microsecond', decided_at, first_token_at) / 1000.0)
            filter (where same_replica and first_token_at > decided_at) as drain_ms,
        -- the prefill tokens left, at this request's prefill start, of the work present whose
        -- first token came after it (null: none, or not the replica that ran the request)
        sum(cast(round(shared_tokens * 1000) as bigint))
            filter (where same_replica and first_token_at > decided_at) / 1000.0
            as drain_shared_tokens
    from present_work
    group by all
)

select * from final
