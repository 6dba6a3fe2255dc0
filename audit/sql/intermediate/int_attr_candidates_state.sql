-- int_attr_candidates_state: one row per candidate replica per routing decision (plus one row
-- for a request with no decision, or a decision with no candidate): the decision, what the
-- router saw, and the candidate's TRUE state at the decision instant rebuilt from executions.
-- Everything here is independent of the SLO and of the attribution thresholds, so it is a
-- materialised table; int_attr_candidates_estimated (a view) adds the calibration choice, the
-- estimates and the threshold-dependent evidence on top, int_attr_candidates_assessed the SLO
-- judgement. Every mart is read once. docs/attribution.md has the formulas. The decisions and
-- candidates come resolved from int_attr_decisions_resolved and int_attr_candidates_resolved.
with

all_requests as (
    select
        request_key,
        anchor_ns,
        input_tokens
    from requests
),

judged_from as (
    -- set inside an incremental refresh's slice only: requests anchored earlier are context
    -- there (read by other rows, never stored), so their alternatives' prefix history is not
    -- looked up
    select judge_from_ns from stg_partitioning
),

all_decisions as (
    select * from decisions
),

timed as (
    select * from int_attr_executions_timed
),

all_snapshots as (
    select * from snapshots
),

decision_prefixes as (
    -- the prefix block hashes a decision span carries, keyed by its request and span. The
    -- keys are made distinct before the join (raw_spans holds one row per trace and span id):
    -- grouping the joined rows carried each hash list through the hash table (4 s at 1M).
    select
        d.request_key,
        d.span_id as decision_span_id,
        s.a_prefix_hashes as prefix_hashes
    from raw_spans as s
    inner join (
        select distinct request_key, trace_id, span_id from all_decisions
    ) as d
        on s.trace_id = d.trace_id
        and s.span_id = d.span_id
    where
        s.name = 'routeaudit.decision'
        and len(s.a_prefix_hashes) > 0
),

decisions_resolved as (
    select * from int_attr_decisions_resolved
),

candidates_resolved as (
    select * exclude (pending_total) from int_attr_candidates_resolved
),

true_state_aggregated as (
    select * from int_attr_candidates_in_flight
),

own_decisions as (
    -- the decisions of the requests this relation gives rows to; a slice also reads earlier
    -- decisions, as context of herding episodes and of prefix history, and gives them none, so
    -- the per-candidate work below skips them
    select d.*
    from decisions_resolved as d
    semi join all_requests as r
        on d.request_key = r.request_key
),

own_candidates as (
    select c.*
    from candidates_resolved as c
    semi join own_decisions as d
        on c.decision_key = d.decision_key
),

observed_replicas as (
    select distinct replica from timed
    union
    select distinct replica from all_snapshots
),

executed_replicas as (
    select distinct replica from timed
),

chosen_telemetry as (
    select
        c.decision_key,
        d.request_id,
        d.request_key,
        d.attempt,
        d.run_id,
        d.decided_at,
        d.chosen_replica,
        d.router_id,
        c.telemetry_ts,
        coalesce(c.seen_pending, 0) as seen_pending
    from candidates_resolved as c
    inner join decisions_resolved as d
        on c.decision_key = d.decision_key
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
        order by decided_at, request_id, request_key, attempt, decision_key
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
        d.decision_key,
        sum(e.preemptions) as preemptions_nearby
    from own_decisions as d
    inner join timed as e
        on d.chosen_replica = e.replica
        and e.request_key <> d.request_key
        and e.start_at <= coalesce(d.exec_prefill_start_at, d.decided_at)
        and e.end_at_eff >= d.decided_at
        and e.preemptions > 0
    group by all
),

cache_shortfalls as (
    -- decisions whose candidates were predicted more cached tokens than the replica reported
    -- (or reported none): the only ones the prefix evidence below can change, as the ideal
    -- placement's cache and the eviction cause both start from such a shortfall. Restricting
    -- the block lookup to them keeps it a fraction of all prefix blocks.
    select c.decision_key
    from own_candidates as c
    inner join own_decisions as d
        on c.decision_key = d.decision_key
    group by c.decision_key
    having max(c.predicted_cached_tokens) > coalesce(any_value(d.exec_cached_tokens), 0)
),

replica_releases as (
    -- per execution: the prefix-cache entries its replica had released up to and including its
    -- end, a running integer sum per replica in end order of the prompt tokens of every
    -- execution ended by then. An ended execution's prompt blocks stay cached, the ones it
    -- computed and the ones it found cached alike, each now among the most recently released
    -- in the LRU order; its output's blocks are freed. A block several prompts shared counts
    -- once for each: an upper bound. Only the difference of two rows of one replica is read
    -- (what was released between them), so where the sum starts (a slice reads a shorter
    -- history) does not matter
    select
        replica,
        request_key,
        first_token_at,
        end_at_eff,
        sum(coalesce(input_tokens, uncached_tokens)) over (
            partition by replica
            order by end_at_eff
            -- executions with the same end count together, so whichever of them a lookup
            -- finds, the sum is the same
            range between unbounded preceding and current row
        ) as released_through
    from timed
    where first_token_at is not null
),

served_rows as (
    -- each prompt a replica served, stamped with the request's first token, until when that
    -- execution still ran (until then its blocks were referenced, and a referenced block is
    -- never evicted), and the entries the replica had released by its end: an LRU cache keeps
    -- a block until the entries released after it no longer fit beside the work running. Each
    -- prefix block of the prompt has this row in its history; two fingerprints of the row
    -- (block_classes)
    select
        e.replica,
        e.first_token_at as served_at,
        e.end_at_eff as ran_until,
        e.released_through as ran_released,
        hash(e.replica, e.first_token_at, e.end_at_eff, e.released_through) as row_print,
        hash(e.released_through, e.end_at_eff, e.first_token_at, e.replica, 'row')
            as row_print_2,
        q.prefix_hashes
    from replica_releases as e
    inner join decision_prefixes as q
        on e.request_key = q.request_key
),

block_classes as (
    -- every served block with its class: the blocks whose history rows are one multiset (the
    -- same count and the same two sums of the rows' fingerprints) have one history, so the
    -- history is kept and looked up once per class, named by its smallest block hash (most
    -- blocks of a shared prefix only ever occur together: 36M history rows become 1.79M at
    -- 1M requests). Exact for any hashes, chained or not
    select
        block_hash,
        min(block_hash) over (partition by n_rows, print, print_2) as class_hash
    from (
        select
            block_hash,
            count(*) as n_rows,
            sum(cast(row_print as hugeint)) as print,
            sum(cast(row_print_2 as hugeint)) as print_2
        from (
            select
                row_print,
                row_print_2,
                unnest(prefix_hashes) as block_hash
            from served_rows
        ) as u
        group by block_hash
    ) as b
),

decision_blocks as (
    -- the blocks of a shortfall decision's prompt that some replica served, by class: a
    -- class's blocks were served together, so it is looked up once and counts for its blocks
    select
        b.decision_key,
        b.chosen_replica,
        b.needed_at,
        b.n_blocks,
        c.class_hash,
        count(*) as class_blocks
    from (
        select
            d.decision_key,
            d.chosen_replica,
            coalesce(d.exec_prefill_start_at, d.decided_at) as needed_at,
            len(p.prefix_hashes) as n_blocks,
            unnest(p.prefix_hashes) as block_hash
        from own_decisions as d
        semi join cache_shortfalls as f
            on d.decision_key = f.decision_key
        inner join decision_prefixes as p
            on d.request_key = p.request_key
            and d.decision_span_id = p.decision_span_id
        where d.chosen_replica is not null
    ) as b
    inner join block_classes as c
        on b.block_hash = c.block_hash
    group by b.decision_key, b.chosen_replica, b.needed_at, b.n_blocks, c.class_hash
),

candidate_alternatives as (
    -- every other candidate of a final decision whose span carries prefix hashes: what that
    -- replica could have held of this prompt. Only final decisions (the attempts judged) and
    -- not the replica that ran it (its report is a fact)
    select
        c.decision_key,
        c.replica,
        d.decided_at,
        r.input_tokens,
        len(p.prefix_hashes) as n_blocks
    from own_candidates as c
    inner join own_decisions as d
        on c.decision_key = d.decision_key
    inner join decision_prefixes as p
        on d.request_key = p.request_key
        and d.decision_span_id = p.decision_span_id
    inner join all_requests as r
        on d.request_key = r.request_key
    cross join judged_from as j
    where
        d.is_final
        and c.replica is distinct from d.exec_replica
        and (j.judge_from_ns is null or r.anchor_ns >= j.judge_from_ns)
),

judged_prompts as not materialized (
    -- the prompt of each judged final decision with an alternative to look up (inline at each
    -- reference: one reads every block, the other the few prompts of fallback lookups)
    select
        d.decision_key,
        p.prefix_hashes
    from own_decisions as d
    inner join decision_prefixes as p
        on d.request_key = p.request_key
        and d.decision_span_id = p.decision_span_id
    semi join candidate_alternatives as a
        on d.decision_key = a.decision_key
    where d.is_final
),

final_decision_classes as (
    -- each class served somewhere among a judged final decision's prompt blocks, with its
    -- deepest position in the prompt, once per decision
    select
        b.decision_key,
        c.class_hash,
        max(b.block_pos) as block_pos
    from (
        select
            decision_key,
            unnest(prefix_hashes) as block_hash,
            unnest(range(1, len(prefix_hashes) + 1)) as block_pos
        from judged_prompts
    ) as b
    inner join block_classes as c
        on b.block_hash = c.block_hash
    group by b.decision_key, c.class_hash
),

looked_up_classes as (
    -- the classes of the prompts whose cache is looked up below: every lookup of the history
    -- is of one of these, so the history keeps only them (a slice reads minutes of prefix
    -- history for seconds of new decisions)
    select class_hash from final_decision_classes
    union
    select class_hash from decision_blocks
),

served_classes as (
    -- each class's history on each replica (served_rows), with until when an execution that
    -- prefilled it there (this one or an earlier one) still ran and the entries the replica had
    -- released by then, running maxima in service order
    select
        *,
        max(ran_until) over (
            partition by replica, class_hash
            order by served_at
            range between unbounded preceding and current row
        ) as pinned_until,
        -- the running sum at the latest end so far: the sum grows with the end
        max(ran_released) over (
            partition by replica, class_hash
            order by served_at
            range between unbounded preceding and current row
        ) as released_at_unpin
    from (
        select
            replica,
            served_at,
            ran_until,
            ran_released,
            unnest(prefix_hashes) as class_hash
        from served_rows
    ) as s
    -- a row holds each class's named block once: one row per execution and class
    semi join looked_up_classes as h
        on s.class_hash = h.class_hash
),

served_pairs as (
    select distinct
        replica,
        class_hash
    from served_classes
),

deepest_served as (
    -- per judged decision and replica, the deepest block of the prompt that replica ever
    -- served (a block it never served is not held): the deepest position of a class served
    -- there. Its held blocks are the deepest position held, so when this block is held that is
    -- its position, whatever the blocks before it: it is looked up first, alone, and an
    -- alternative's other classes only when it is not held (on a busy fleet whose prompts
    -- share long prefixes served on every replica, most alternatives need this one lookup).
    -- The deepest position is found first and its class joined back (a position is one class
    -- of the decision's prompt): a max over a plain integer is a hash aggregation on Spark, an
    -- arg_max carrying the hash a sort of every (class, replica) pair
    select
        s.decision_key,
        s.replica,
        s.block_pos,
        b.class_hash
    from (
        select
            f.decision_key,
            v.replica,
            max(f.block_pos) as block_pos
        from final_decision_classes as f
        inner join served_pairs as v
            on f.class_hash = v.class_hash
        group by f.decision_key, v.replica
    ) as s
    inner join final_decision_classes as b
        on s.decision_key = b.decision_key
        and s.block_pos = b.block_pos
),

candidate_deepest as (
    select
        a.decision_key,
        a.replica,
        a.decided_at,
        s.block_pos,
        s.class_hash
    from deepest_served as s
    inner join candidate_alternatives as a
        on s.decision_key = a.decision_key
        and s.replica = a.replica
),

block_lookups as (
    -- the (decision, replica, class) triples looked up first: the chosen replica's classes of
    -- a shortfall decision before its prefill, and each alternative's deepest class served
    -- there, at the decision instant
    select
        'chosen' as side,
        decision_key,
        chosen_replica as replica,
        class_hash,
        needed_at as looked_up_at,
        n_blocks,
        class_blocks,
        null as block_pos
    from decision_blocks
    union all
    select
        'alternative' as side,
        decision_key,
        replica,
        class_hash,
        decided_at as looked_up_at,
        null as n_blocks,
        null as class_blocks,
        block_pos
    from candidate_deepest
),

served_keyed as (
    -- each service of a class, keyed for the ASOF joins below: the (replica, class, instant)
    -- triple is folded into one orderable key, so an ASOF join is one sort-merge instead of
    -- one partition per class (several times slower); a match is kept only when it is the same
    -- replica and class. Each join reads only the (replica, class) pairs it looks up: a prefix
    -- shared by most requests is served on every replica
    select
        *,
        (cast(hash(replica, class_hash) >> 2 as hugeint) << 64)
        + epoch_us(served_at) as served_key
    from served_classes
),

blocks_served as (
    -- the last time the replica served each class looked up at or before its instant
    select
        b.*,
        case
            when s.replica = b.replica and s.class_hash = b.class_hash
                then s.served_at
        end as served_at,
        case
            when s.replica = b.replica and s.class_hash = b.class_hash
                then s.released_at_unpin
        end as released_at_unpin,
        case
            when s.replica = b.replica and s.class_hash = b.class_hash
                then s.pinned_until
        end as pinned_until
    from (
        select
            *,
            (cast(hash(replica, class_hash) >> 2 as hugeint) << 64)
            + epoch_us(looked_up_at) as needed_key
        from block_lookups
    ) as b
    asof left join (
        select s.*
        from served_keyed as s
        semi join (select distinct replica, class_hash from block_lookups) as p
            on s.replica = p.replica
            and s.class_hash = p.class_hash
    ) as s
        on b.needed_key >= s.served_key
),

prefix_served as (
    -- earlier requests sharing prefix blocks with this one were prefilled on the chosen replica
    -- before this prefill: the replica held (part of) the prefix. Block hashes are chained, so
    -- the blocks found form a prefix and their count is the longest shared prefix. Looking back
    -- at most 300 s (which keeps the search linear in the number of requests).
    select
        decision_key,
        max(served_at) as prefix_last_served_at,
        cast(sum(class_blocks) as bigint) as prefix_shared_blocks,
        cast(sum(class_blocks) as bigint) / any_value(n_blocks) as prefix_shared_frac
    from blocks_served
    where side = 'chosen' and served_at >= looked_up_at - interval 300 second
    group by decision_key
),

instant_released as (
    -- each alternative's running sum of released entries at the decision (through the last
    -- execution ended at or before it): the same folded-key ASOF join
    select
        i.decision_key,
        i.replica,
        case when t.replica = i.replica then t.released_through else 0 end as released_at
    from (
        select
            *,
            (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(decided_at) as at_key
        from candidate_alternatives
    ) as i
    asof left join (
        select
            replica,
            released_through,
            (cast(hash(replica) >> 2 as hugeint) << 64) + epoch_us(end_at_eff) as at_key
        from replica_releases
    ) as t
        on i.at_key >= t.at_key
),

capacity_seen as (
    -- the replica's prefix-cache room at the decision: its KV pool less the tokens its running
    -- executions hold. A candidate seen with KV in use gives one estimate of its pool, those
    -- tokens over the KV usage the router saw of it, and the decision's pool is the median of
    -- its candidates' estimates (the replicas a router chooses among serve one model: their
    -- pools are alike). One estimate is noisy both ways: work admitted or finished between the
    -- router's sample and the decision moves the tokens and not the usage, and executions
    -- sharing cached blocks count them once each. No estimate (nothing in use on the fleet the
    -- router saw): no pool
    select
        decision_key,
        replica,
        median(own_pool) over (partition by decision_key)
        - coalesce(held_tokens, 0) as cache_room
    from (
        select
            c.decision_key,
            c.replica,
            max(s.true_held_tokens) as held_tokens,
            max(
                case
                    when c.seen_kv_usage > 0 and s.true_held_tokens > 0
                        then s.true_held_tokens / c.seen_kv_usage
                end
            ) as own_pool
        from own_candidates as c
        left join true_state_aggregated as s
            on c.decision_key = s.decision_key
            and c.replica = s.replica
        group by c.decision_key, c.replica
    ) as p
),

alternative_limits as (
    -- what a block must meet to count as held by an alternative at the decision: served there
    -- within 300 s, and a busy replica's LRU prefix cache evicts the entries released longest
    -- ago first, so only while the entries released there since the block's last execution
    -- ended, with the prompt's prefix up to the block itself (its share of the prompt), fit in
    -- the room its running executions leave in the pool (capacity_seen); without a KV usage to
    -- size the pool, served within 30 s. A block an execution still running there prefilled
    -- is held whatever was released (deepest_held: pinned_until)
    select
        a.decision_key,
        a.replica,
        a.decided_at,
        t.released_at,
        a.input_tokens,
        a.n_blocks,
        c.cache_room,
        a.decided_at - case
            when c.cache_room is null then interval 30 second else interval 300 second
        end as served_since
    from candidate_alternatives as a
    inner join instant_released as t
        on a.decision_key = t.decision_key
        and a.replica = t.replica
    left join capacity_seen as c
        on a.decision_key = c.decision_key
        and a.replica = c.replica
),

deepest_held as (
    select
        b.decision_key,
        b.replica,
        b.block_pos,
        coalesce(
                b.pinned_until > l.decided_at
                or (
                    b.served_at >= l.served_since
                    and (
                        l.cache_room is null
                        or l.released_at - b.released_at_unpin
                        + coalesce(l.input_tokens, 0) * b.block_pos / l.n_blocks
                        <= l.cache_room
                    )
                ),
                false
            ) as held
    from blocks_served as b
    inner join alternative_limits as l
        on b.decision_key = l.decision_key
        and b.replica = l.replica
    where b.side = 'alternative'
),

fallback_lookups as (
    -- every class of the prompt served on an alternative whose deepest block is not held
    select
        f.decision_key,
        f.replica,
        b.class_hash,
        a.decided_at as looked_up_at
    from deepest_held as f
    inner join candidate_alternatives as a
        on f.decision_key = a.decision_key
        and f.replica = a.replica
    inner join final_decision_classes as b
        on f.decision_key = b.decision_key
    semi join served_pairs as v
        on f.replica = v.replica
        and b.class_hash = v.class_hash
    where not f.held
),

fallback_served as (
    select
        b.*,
        case
            when s.replica = b.replica and s.class_hash = b.class_hash
                then s.served_at
        end as served_at,
        case
            when s.replica = b.replica and s.class_hash = b.class_hash
                then s.released_at_unpin
        end as released_at_unpin,
        case
            when s.replica = b.replica and s.class_hash = b.class_hash
                then s.pinned_until
        end as pinned_until
    from (
        select
            *,
            (cast(hash(replica, class_hash) >> 2 as hugeint) << 64)
            + epoch_us(looked_up_at) as needed_key
        from fallback_lookups
    ) as b
    asof left join (
        select s.*
        from served_keyed as s
        semi join (select distinct replica, class_hash from fallback_lookups) as p
            on s.replica = p.replica
            and s.class_hash = p.class_hash
    ) as s
        on b.needed_key >= s.served_key
),

fallback_positions as (
    -- every position of the looked-up classes in their prompts: a class's blocks share its
    -- service, but the held test is per position (the prompt's prefix up to the block is one
    -- of its terms)
    select
        b.decision_key,
        c.class_hash,
        b.block_pos
    from (
        select
            j.decision_key,
            unnest(j.prefix_hashes) as block_hash,
            unnest(range(1, len(j.prefix_hashes) + 1)) as block_pos
        from judged_prompts as j
        semi join fallback_lookups as f
            on j.decision_key = f.decision_key
    ) as b
    inner join block_classes as c
        on b.block_hash = c.block_hash
),

fallback_held as (
    select
        b.decision_key,
        b.replica,
        max(b.block_pos) filter (
            where coalesce(
                    b.pinned_until > l.decided_at
                    or (
                        b.served_at >= l.served_since
                        and (
                            l.cache_room is null
                            or l.released_at - b.released_at_unpin
                            + coalesce(l.input_tokens, 0) * b.block_pos / l.n_blocks
                            <= l.cache_room
                        )
                    ),
                    false
                )
        ) as held_blocks
    from (
        select
            s.*,
            q.block_pos
        from fallback_served as s
        inner join fallback_positions as q
            on s.decision_key = q.decision_key
            and s.class_hash = q.class_hash
    ) as b
    inner join alternative_limits as l
        on b.decision_key = l.decision_key
        and b.replica = l.replica
    group by b.decision_key, b.replica
),

candidate_prefix_held as (
    -- the longest prefix the replica still held at the decision: the deepest position held.
    -- Hashes are chained: a block served at position k means the k blocks before it were
    -- served with it
    select
        a.decision_key,
        a.replica,
        a.n_blocks as prefix_n_blocks,
        coalesce(case when d.held then d.block_pos else f.held_blocks end, 0)
            as prefix_held_blocks
    from candidate_alternatives as a
    left join deepest_held as d
        on a.decision_key = d.decision_key
        and a.replica = d.replica
    left join fallback_held as f
        on a.decision_key = f.decision_key
        and a.replica = f.replica
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
        s.drain_shared_tokens,
        -- cache the request would have found there: the replica's report where it ran; else
        -- the replica's own history of the prompt's prefix blocks (the blocks it served
        -- before the decision, in proportion of the prompt); else the router's prediction
        -- (0 when the router predicted nothing)
        case
            when c.replica = d.exec_replica and d.exec_cached_tokens is not null
                then d.exec_cached_tokens
            when h.prefix_n_blocks > 0
                then cast(
                    floor(coalesce(r.input_tokens, 0) * h.prefix_held_blocks / h.prefix_n_blocks)
                    as bigint
                )
            else least(
                coalesce(c.predicted_cached_tokens, 0),
                coalesce(r.input_tokens, c.predicted_cached_tokens, 0)
            )
        end as cached_assumed_tokens,
        case
            when c.replica = d.exec_replica and d.exec_cached_tokens is not null
                then 'replica_report'
            when h.prefix_n_blocks > 0 then 'prefix_history'
            else 'router_prediction'
        end as cache_source,
        h.prefix_held_blocks,
        -- the load is rebuilt from the executions in flight there, when the store has any
        -- execution on that replica; a replica known only from scrapes is idle by that rebuild
        case
            when e.replica is not null then 'executions'
            when o.replica is not null then 'scrapes'
            else 'router_view'
        end as load_source,
        -- FCFS: it would start prefill once the work present at t had its first token
        greatest(coalesce(s.drain_ms, 0.0) - d.forward_delay_ms, 0.0) as wait_est_ms
    from own_candidates as c
    inner join own_decisions as d
        on c.decision_key = d.decision_key
    left join true_state_aggregated as s
        on c.decision_key = s.decision_key
        and c.replica = s.replica
    left join observed_replicas as o
        on c.replica = o.replica
    left join executed_replicas as e
        on c.replica = e.replica
    left join all_requests as r
        on c.request_key = r.request_key
    left join candidate_prefix_held as h
        on c.decision_key = h.decision_key
        and c.replica = h.replica
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
        p.request_key is not null as has_prefix_hashes,
        s.prefix_last_served_at,
        s.prefix_shared_blocks,
        s.prefix_shared_frac
    from own_decisions as d
    left join herding_members as h
        on d.decision_key = h.decision_key
    left join preemptions_nearby as n
        on d.decision_key = n.decision_key
    left join decision_prefixes as p
        on d.request_key = p.request_key
        and d.decision_span_id = p.decision_span_id
    left join prefix_served as s
        on d.decision_key = s.decision_key
),

final as (
    select
        r.request_key,
        d.* exclude (
            decision_key, request_key, request_id, run_id, router_id, policy, chosen_replica
        ),
        d.router_id as decision_router_id,
        d.policy as decision_policy,
        d.chosen_replica as decision_replica,
        c.* exclude (decision_key, request_key, attempt, decision_span_id)
    from all_requests as r
    left join decisions_evidenced as d
        on r.request_key = d.request_key
    left join candidates_with_state as c
        on d.decision_key = c.decision_key
)

select * from final
