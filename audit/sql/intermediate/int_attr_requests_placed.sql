-- int_attr_requests_placed: one row per request (request_key): its final routing attempt summed
-- up from int_attr_candidates_estimated: the chosen candidate, the best alternative (lowest
-- estimated TTFT among the other eligible, observed candidates), the ideal placement (best cache
-- that existed, on a nominal idle replica) and the shortest wait any candidate had. It depends on
-- the attribution thresholds but not on the SLO, so refresh() also stores it at the default
-- thresholds: a reader with another SLO (the dashboard's sidebar) then judges its slow requests
-- against this table instead of re-assessing every candidate. attributions reads it.
-- The router's policy is re-run on the true state when its rule is known: a named policy, or a
-- score the router recorded for every candidate whose ranking a view quantity reproduces
-- (score_rows .. score_replay).
with

estimated as (
    select * from int_attr_candidates_estimated
),

thresholds as (
    select * from int_attr_thresholds
),

estimated_queues as (
    -- the queue (Q) a Q + P policy would have estimated on the true state: where what the
    -- router recorded of the replica was its true state at the decision (the same waiting and
    -- running, nothing pending, sampled less than misroute_min_ms before: too little time for
    -- a material drain), the router's own estimate, its cost model on those inputs (the
    -- audit's wait in its place would pass the router's misjudging of work it saw right for a
    -- stale view); elsewhere the audit's wait at the fleet's speed (the router's estimates
    -- know the load, not the speed)
    select
        e.*,
        case
            when e.router_est_queue_ms is not null
                and e.seen_waiting = e.true_waiting
                and e.seen_running = e.true_running
                and coalesce(e.seen_pending, 0) = 0
                and e.telemetry_age_ms < t.misroute_min_ms
                then e.router_est_queue_ms
            else e.wait_nominal_ms
        end as true_queue_ms
    from estimated as e
    cross join thresholds as t
),

all_requests as (
    select
        request_key,
        input_tokens,
        predicted_cached_tokens
    from requests
),

final_rows as (
    -- the rows of the final routing attempt of each request. Estimates are ranked on a grid
    -- of estimate_tolerance_ms (estimates closer than that are equal), then by a stable key:
    -- the replica, then what the router recorded about it (a router may list a replica twice)
    select
        e.* exclude (input_tokens, predicted_cached_tokens),
        e.predicted_cached_tokens as candidate_predicted_cached_tokens,
        r.input_tokens,
        r.predicted_cached_tokens,
        round(e.ttft_est_ms / t.estimate_tolerance_ms) as ttft_est_rank,
        round(e.wait_est_ms / t.estimate_tolerance_ms) as wait_est_rank,
        -- Q + P on the true state (estimated_queues) with the router's own prefill estimate
        -- (its cache view)
        round(
            (e.true_queue_ms + coalesce(e.router_est_prefill_ms, e.prefill_est_ms))
            / t.estimate_tolerance_ms
        ) as true_qp_rank,
        round(e.true_queue_ms / t.estimate_tolerance_ms) as true_queue_rank,
        round(
            (e.router_est_queue_ms + e.router_est_prefill_ms) / t.estimate_tolerance_ms
        ) as view_qp_rank,
        e.seen_waiting + coalesce(e.seen_running, 0) + coalesce(e.seen_pending, 0)
            as seen_load,
        {
            'replica': e.replica,
            'seen_waiting': e.seen_waiting,
            'seen_running': e.seen_running,
            'seen_pending': e.seen_pending,
            'telemetry_ts': e.telemetry_ts,
            'predicted_cached_tokens': e.predicted_cached_tokens,
            'router_est_queue_ms': e.router_est_queue_ms,
            'router_est_prefill_ms': e.router_est_prefill_ms
        } as stable_key
    from estimated_queues as e
    cross join thresholds as t
    inner join all_requests as r
        on e.request_key = r.request_key
    where coalesce(e.is_final, true)
),

request_level as (
    select
        request_key,
        bool_or(decision_span_id is not null or decided_at is not null)
            as has_decision,
        count(replica) as candidates,
        count(replica) filter (where eligible and not replica_observed)
            as eligible_unobserved,
        -- ideal: a nominal idle replica (the run's idle fit) holding the best cache
        -- that existed at the decision: the replica's report where it ran, unless earlier
        -- requests sharing the predicted prefix were served there before (then the router's
        -- prediction held at the decision and the blocks went later); elsewhere the router's
        -- prediction
        any_value(idle_prefill_intercept_ms) as idle_intercept_ms,
        any_value(idle_prefill_ms_per_token) as idle_ms_per_token,
        any_value(idle_prefill_attn_ms_per_token2) as idle_attn_ms_per_token2,
        any_value(input_tokens) as input_tokens,
        least(
            max(
                case
                    -- (the shared blocks, give or take one, cover the prediction)
                    when chosen
                        and prefix_shared_blocks > 0
                        and prefix_shared_frac * (1.0 + 1.0 / prefix_shared_blocks)
                        * input_tokens >= coalesce(predicted_cached_tokens, 0)
                        then greatest(
                            cached_assumed_tokens, coalesce(predicted_cached_tokens, 0)
                        )
                    else cached_assumed_tokens
                end
            ) filter (where eligible and replica_observed),
            any_value(input_tokens)
        ) as ideal_cached_tokens,
        -- ties go to the replica named last, so every rebuild names the same one
        arg_max(replica, (cached_assumed_tokens, replica))
            filter (where eligible and replica_observed) as ideal_replica,
        -- the wait even the best placement would have had (estimated on the true state)
        min(wait_est_ms) filter (where eligible and replica_observed) as min_wait_ms,
        arg_min(replica, (wait_est_rank, stable_key))
            filter (where eligible and replica_observed) as min_wait_replica
    from final_rows
    group by request_key
),

chosen as (
    select *
    from final_rows
    where chosen
    qualify row_number() over (partition by request_key order by stable_key) = 1
),

best_alternative as (
    -- the columns final reads of the lowest (ttft_est_rank, stable_key): one hash aggregate, where a
    -- top-1 window sorted every candidate row (7.6 -> 5.3 s at 1M requests, same rows)
    select
        request_key,
        -- unnest of a struct spreads its fields into columns; an alias would name one column
        unnest(arg_min(  -- noqa: AL03
            {
                'replica': replica,
                'seen_waiting': seen_waiting,
                'seen_running': seen_running,
                'true_running': true_running,
                'seen_pending': seen_pending,
                'true_waiting': true_waiting,
                'wait_est_ms': wait_est_ms,
                'wait_nominal_ms': wait_nominal_ms,
                'prefill_est_ms': prefill_est_ms,
                'ttft_est_ms': ttft_est_ms,
                'cached_assumed_tokens': cached_assumed_tokens,
                'router_est_queue_ms': router_est_queue_ms,
                'router_est_prefill_ms': router_est_prefill_ms,
                'cache_source': cache_source,
                'load_source': load_source
            },
            (ttft_est_rank, stable_key)
        ))
    from final_rows
    where
        not chosen
        and eligible
        and replica_observed
        and ttft_est_ms is not null
    group by request_key
),

policy_replayed as (
    -- the router's own policy re-run on the TRUE state at the decision instant (true queues
    -- and remaining work from executions, its own cache prediction kept), for the policies
    -- whose rule is known: which replica it would have chosen. Policies blind to the state
    -- (round_robin, random) choose the same replica whatever they see; power_of_two is
    -- re-run on the pair it sampled (the candidates it scored). Ties go to the stable key.
    select
        f.request_key,
        any_value(lower(f.decision_policy)) as policy_name,
        -- least work in tokens (least_load) and least requests (cache_aware's load)
        arg_min(f.replica, (f.true_remaining_tokens, f.stable_key)) as least_work_replica,
        arg_min(f.replica, (f.true_remaining_tokens, f.stable_key))
            filter (where f.score is not null) as sampled_least_work_replica,
        count(f.score) as scored_candidates,
        arg_min(f.replica, (f.true_waiting + f.true_running, f.stable_key))
            as least_requests_replica,
        min(f.true_waiting + f.true_running) as min_true_load,
        max(f.true_waiting + f.true_running) as max_true_load,
        arg_min(
            f.replica,
            (-coalesce(f.candidate_predicted_cached_tokens, 0), f.true_waiting + f.true_running, f.stable_key)
        ) as best_match_replica,
        max(coalesce(f.candidate_predicted_cached_tokens, 0)) / greatest(any_value(f.input_tokens), 1)
            as best_match_rate,
        arg_min(f.replica, (f.true_qp_rank, f.stable_key)) as least_qp_replica,
        -- the same policy on the router's own view: a replay that does not give the replica
        -- it chose means the policy is not what the audit assumes (or its inputs were not
        -- recorded), and the replay is not used
        arg_min(f.replica, (f.score, f.stable_key)) filter (where f.score is not null)
            as view_least_score_replica,
        count(f.seen_waiting) as seen_candidates,
        count(*) as replayed_candidates,
        arg_min(f.replica, (f.seen_load, f.stable_key)) as view_least_requests_replica,
        min(f.seen_load) as min_seen_load,
        max(f.seen_load) as max_seen_load,
        arg_min(
            f.replica,
            (-coalesce(f.candidate_predicted_cached_tokens, 0), f.seen_load, f.stable_key)
        ) as view_best_match_replica,
        arg_min(f.replica, (f.view_qp_rank, f.stable_key))
            filter (where f.view_qp_rank is not null) as view_least_qp_replica,
        count(f.view_qp_rank) as view_qp_candidates,
        any_value(f.replica) filter (where f.chosen) as chosen_replica,
        -- the view is what the router recorded, not rebuilt from scrapes
        bool_and(f.evidence_source = 'recorded') as view_recorded
    from final_rows as f
    where f.eligible and f.replica_observed
    group by f.request_key
),

score_rows as (
    -- a decision whose policy is none of the named ones (policy_rule) but whose router
    -- recorded a score for each of its eligible observed candidates (two or more): the
    -- candidates' scores ranked, and next to them each view quantity such a score may follow,
    -- with its counterpart on the true state. Scores and view quantities (numbers the router
    -- computed with) are equal within 1e-6; the true state is ranked on its grids (counts
    -- exact, tokens to 1, milliseconds to estimate_tolerance_ms). The router's cache
    -- prediction is not one of them: the same on the view and on the true state, a score
    -- following it alone would say the view never mattered, whatever else the policy weighs
    select
        f.request_key,
        f.replica,
        f.chosen,
        f.stable_key,
        f.score,
        dense_rank() over (partition by f.request_key order by round(f.score, 6))
            as score_rank,
        round(f.seen_waiting + f.seen_running + f.seen_pending, 6) as view_requests_pending,
        round(f.seen_waiting + f.seen_running, 6) as view_requests,
        round(f.seen_waiting, 6) as view_waiting,
        cast(f.true_waiting + f.true_running as double) as true_requests,
        cast(f.true_waiting as double) as true_waiting,
        round(f.seen_remaining_tokens, 6) as view_remaining_tokens,
        round(f.true_remaining_tokens) as true_remaining_tokens,
        round(f.router_est_queue_ms + f.router_est_prefill_ms, 6) as view_qp,
        cast(f.true_qp_rank as double) as true_qp,
        round(f.router_est_queue_ms, 6) as view_queue,
        cast(f.true_queue_rank as double) as true_queue
    from final_rows as f
    inner join policy_replayed as p
        on f.request_key = p.request_key
    where
        f.eligible
        and f.replica_observed
        and p.scored_candidates = p.replayed_candidates
        and p.replayed_candidates >= 2
        and coalesce(p.policy_name, '') not in (
            'round_robin', 'random', 'least_load', 'least_loaded', 'power_of_two', 'qp_cost',
            'least_request', 'least_requests', 'cache_aware'
        )
),

score_quantities as (
    -- one row per (candidate, quantity): ord numbers the quantities in the order the evidence
    -- names them
    select
        r.request_key,
        r.replica,
        r.chosen,
        r.stable_key,
        r.score,
        r.score_rank,
        q.ord,
        q.quantity,
        case q.ord
            when 1 then r.view_requests_pending
            when 2 then r.view_requests
            when 3 then r.view_waiting
            when 4 then r.view_remaining_tokens
            when 5 then r.view_qp
            when 6 then r.view_queue
        end as view_q,
        case q.ord
            when 1 then r.true_requests
            when 2 then r.true_requests
            when 3 then r.true_waiting
            when 4 then r.true_remaining_tokens
            when 5 then r.true_qp
            when 6 then r.true_queue
        end as true_q
    from score_rows as r
    cross join (
        values
        (1, 'waiting + running + pending'),
        (2, 'waiting + running'),
        (3, 'waiting'),
        (4, 'remaining tokens'),
        (5, 'queue + prefill estimate'),
        (6, 'queue estimate')
    ) as q (ord, quantity)
),

score_quantities_ranked as (
    -- the quantity's rank, and the line through the lowest and the highest score (the first
    -- and last by score, then stable key) that a score linear in the quantity lies on
    select
        *,
        dense_rank() over (partition by request_key, ord order by view_q) as view_rank,
        min(score) over (partition by request_key, ord) as score_lo,
        max(score) over (partition by request_key, ord) as score_hi,
        arg_min(view_q, (score, stable_key)) over (partition by request_key, ord) as q_lo,
        arg_max(view_q, (score, stable_key)) over (partition by request_key, ord) as q_hi
    from score_quantities
),

score_quantity_fits as (
    -- per (decision, quantity): is the score linear in the quantity (every score within 1e-6,
    -- relative above 1, of the line; slope says which way), else does the quantity rank the
    -- candidates exactly as the scores do (ties included), in the same order (follows) or
    -- the opposite one (reverses). The direction of the score comes from the chosen
    -- candidate (lowest score: lower is better; highest: higher is better). The replica the
    -- quantity picks on the true state: ties to the stable key (the replica named first), as
    -- for the named policies
    select
        request_key,
        ord,
        any_value(quantity) as quantity,
        count(view_q) = count(*) and count(true_q) = count(*) as complete,
        coalesce(bool_and(
            abs(score - score_lo - (score_hi - score_lo) / (q_hi - q_lo) * (view_q - q_lo))
            <= 1e-6 * greatest(1.0, abs(score))
        ), false) as linear,
        sign(any_value((score_hi - score_lo) / (q_hi - q_lo))) as slope_sign,
        bool_and(view_rank = score_rank) as follows,
        min(view_rank + score_rank) = max(view_rank + score_rank)
        and max(view_rank) = max(score_rank) as reverses,
        max(score_rank) as score_ranks,
        min(score_rank) filter (where chosen) as chosen_score_rank,
        arg_min(replica, (true_q, stable_key)) as lowest_true_replica,
        arg_min(replica, (-true_q, stable_key)) as highest_true_replica
    from score_quantities_ranked
    group by request_key, ord
),

score_quantity_choices as (
    -- the quantities used: those the score is linear in, else those ranking as it does
    select
        *,
        fits and (linear or not bool_or(fits and linear) over (partition by request_key))
            as used,
        case when lower_first then lowest_true_replica else highest_true_replica end
            as true_replica
    from (
        select
            *,
            complete and direction_known and rising is not null as fits,
            (rising and lower_is_better) or (not rising and higher_is_better) as lower_first
        from (
            select
                *,
                case
                    when linear then slope_sign > 0
                    when follows then true
                    when reverses then false
                end as rising,
                coalesce(score_ranks > 1 and chosen_score_rank = 1, false) as lower_is_better,
                coalesce(score_ranks > 1 and chosen_score_rank = score_ranks, false)
                    as higher_is_better,
                coalesce(
                    score_ranks > 1
                    and (chosen_score_rank = 1 or chosen_score_rank = score_ranks),
                    false
                ) as direction_known,
                chosen_score_rank is not null as chosen_scored,
                score_ranks = 1 as scores_equal
            from score_quantity_fits
        ) as d
    ) as c
),

score_replay as (
    -- per decision: the quantities used. When they all pick the same replica on the true
    -- state, that is the policy's true-state choice; else (none fits, or they disagree) the
    -- policy stays unknown and policy_score_not_replayed says why
    select
        request_key,
        count(*) filter (where used) as fitting,
        count(distinct true_replica) filter (where used) as true_choices,
        any_value(true_replica) filter (where used) as true_replica,
        bool_or(used and linear) as linear,
        bool_or(direction_known) as direction_known,
        bool_or(chosen_scored) as chosen_scored,
        bool_or(scores_equal) as scores_equal,
        -- every quantity used is a request count (waiting + running + pending, waiting +
        -- running, waiting): compared as true counts on the true state
        coalesce(bool_and(ord <= 3) filter (where used), false) as counts_only,
        concat_ws(
            ', ',
            any_value(quantity) filter (where used and ord = 1),
            any_value(quantity) filter (where used and ord = 2),
            any_value(quantity) filter (where used and ord = 3),
            any_value(quantity) filter (where used and ord = 4),
            any_value(quantity) filter (where used and ord = 5),
            any_value(quantity) filter (where used and ord = 6)
        ) as quantities,
        concat_ws(
            ', ',
            any_value(quantity) filter (where used and ord = 1 and lower_first),
            any_value(quantity) filter (where used and ord = 2 and lower_first),
            any_value(quantity) filter (where used and ord = 3 and lower_first),
            any_value(quantity) filter (where used and ord = 4 and lower_first),
            any_value(quantity) filter (where used and ord = 5 and lower_first),
            any_value(quantity) filter (where used and ord = 6 and lower_first)
        ) as lower_first_quantities
    from score_quantity_choices
    group by request_key
),

score_replay_described as (
    select
        request_key,
        case when fitting > 0 and true_choices = 1 then true_replica end as true_replica,
        fitting > 0 and true_choices = 1 and counts_only as compares_counts,
        case
            when fitting > 0 and true_choices = 1
                then 'its recorded score '
                || case when linear then 'linear in ' else 'ranked as ' end
                || quantities
                || case
                    when lower_first_quantities = quantities then ', lower first'
                    when lower_first_quantities = '' then ', higher first'
                    else ', lower first for ' || lower_first_quantities
                end
        end as replayed_as,
        case
            when not chosen_scored
                then 'the replica it chose is not among its scored candidates'
            when scores_equal then 'its recorded scores were all equal'
            when not direction_known
                then 'the replica it chose had neither the lowest nor the highest recorded score'
            when fitting = 0
                then 'no view quantity ranks the candidates as its recorded scores do'
            when true_choices > 1
                then 'the view quantities '
                || case when linear then 'its recorded scores are linear in (' else
                    'ranking the candidates as its recorded scores do (' end
                || quantities || ') pick different replicas on the true state'
        end as not_replayed
    from score_replay
),

policy_bases as (
    -- the inputs of each policy's rule twice, on the true state and on the router's view, so
    -- one rule (policy_rule) serves both. On the view: a recorded score decides for the
    -- policies that score (least_load, power_of_two, qp_cost), else its Q+P when recorded for
    -- every candidate, else its counts and predictions when it recorded them for every
    -- candidate; least work in tokens is not on the view
    select
        request_key,
        policy_name,
        chosen_replica,
        'true' as basis,
        cast(null as varchar) as score_replica,
        least_work_replica,
        sampled_least_work_replica,
        scored_candidates,
        least_qp_replica as qp_replica,
        true as view_complete,
        least_requests_replica,
        min_true_load as min_load,
        max_true_load as max_load,
        best_match_replica,
        best_match_rate,
        view_recorded
    from policy_replayed
    union all
    select
        request_key,
        policy_name,
        chosen_replica,
        'view' as basis,
        view_least_score_replica as score_replica,
        null as least_work_replica,
        null as sampled_least_work_replica,
        0 as scored_candidates,
        case
            when view_qp_candidates = replayed_candidates then view_least_qp_replica
        end as qp_replica,
        seen_candidates = replayed_candidates as view_complete,
        view_least_requests_replica as least_requests_replica,
        min_seen_load as min_load,
        max_seen_load as max_load,
        view_best_match_replica as best_match_replica,
        best_match_rate,
        view_recorded
    from policy_replayed
),

policy_rule as (
    -- the replica each policy chooses on one basis: null when its inputs are not there
    select
        p.request_key,
        p.policy_name,
        p.chosen_replica,
        p.basis,
        case
            when p.policy_name in ('round_robin', 'random') then p.chosen_replica
            when p.policy_name in ('least_load', 'least_loaded', 'power_of_two', 'qp_cost')
                and p.score_replica is not null
                then p.score_replica
            when p.policy_name in ('least_load', 'least_loaded') then p.least_work_replica
            when p.policy_name = 'power_of_two' and p.scored_candidates = 2
                then p.sampled_least_work_replica
            when p.policy_name = 'qp_cost' then p.qp_replica
            when not p.view_complete then null
            when p.policy_name in ('least_request', 'least_requests')
                then p.least_requests_replica
            when p.policy_name = 'cache_aware' and (
                p.max_load - p.min_load > t.cache_aware_balance_abs
                and p.max_load > p.min_load * t.cache_aware_balance_rel
            ) then p.least_requests_replica
            when p.policy_name = 'cache_aware'
                and p.best_match_rate > t.cache_aware_cache_threshold
                then p.best_match_replica
            when p.policy_name = 'cache_aware' then p.least_requests_replica
        end as replica,
        -- the rule compares request counts (and the cache predictions, the same on both
        -- bases): on the view the counts the router recorded, on the true state the true
        -- ones, the same quantities
        p.view_complete
        and p.policy_name in ('least_request', 'least_requests', 'cache_aware')
            as compares_counts,
        p.view_recorded
    from policy_bases as p
    cross join thresholds as t
),

policy_choice as (
    select
        request_key,
        any_value(policy_name) as policy_name,
        any_value(chosen_replica) as chosen_replica,
        any_value(replica) filter (where basis = 'true') as policy_true_replica,
        any_value(replica) filter (where basis = 'view') as policy_view_replica,
        any_value(compares_counts) filter (where basis = 'view') as policy_compares_counts,
        bool_and(view_recorded) as view_recorded
    from policy_rule
    group by request_key
),

policy_choice_checked as (
    -- the replay is used only when, on the router's view, it gives the replica chosen (or the
    -- view was not recorded well enough to say). A replayed score gives the chosen replica on
    -- the view by construction (its quantity ranks the candidates as the scores do)
    select
        c.request_key,
        c.policy_name,
        coalesce(c.policy_true_replica, s.true_replica) as policy_true_replica,
        c.policy_view_replica,
        coalesce(
            c.view_recorded and (
                (c.policy_view_replica is not null and c.policy_compares_counts)
                or (c.policy_true_replica is null and s.compares_counts)
            ),
            false
        ) as policy_view_compares_counts,
        s.replayed_as as policy_score_replayed_as
    from policy_choice as c
    left join score_replay_described as s
        on c.request_key = s.request_key
    where c.policy_view_replica is null or c.policy_view_replica = c.chosen_replica
),

policy_choice_estimated as (
    -- what the request would have had on the replica the policy chooses on the true state
    select
        c.request_key,
        c.policy_name,
        c.policy_true_replica,
        c.policy_view_replica,
        c.policy_view_compares_counts,
        c.policy_score_replayed_as,
        min(f.ttft_est_ms) as policy_true_ttft_est_ms,
        min(f.wait_est_ms) as policy_true_wait_est_ms,
        min(f.wait_nominal_ms) as policy_true_wait_nominal_ms,
        -- what the router saw of it (a replica listed twice: the first record)
        arg_min(
            coalesce(f.seen_waiting, 0) + coalesce(f.seen_running, 0)
            + coalesce(f.seen_pending, 0),
            f.stable_key
        ) as policy_true_seen_load,
        min(f.true_waiting + f.true_running) as policy_true_true_load,
        arg_min(f.router_est_queue_ms, f.stable_key) as policy_true_router_est_queue_ms
    from policy_choice_checked as c
    inner join final_rows as f
        on c.request_key = f.request_key
        and c.policy_true_replica = f.replica
    group by all
),

final as (
    select
        r.* exclude (idle_intercept_ms, idle_ms_per_token, idle_attn_ms_per_token2, input_tokens),
        r.idle_intercept_ms
        + r.idle_ms_per_token * (r.input_tokens - r.ideal_cached_tokens)
        + r.idle_attn_ms_per_token2 * (r.input_tokens - r.ideal_cached_tokens)
        * (r.ideal_cached_tokens + (r.input_tokens - r.ideal_cached_tokens) / 2.0)
            as ideal_prefill_ms,
        -- the idle fit's per-token and attention terms (the prompt alone; without an idle fit
        -- in the window, the fleet reference slope and no attention term): what recomputing
        -- tokens a cache did not hold costs (attributions, eviction)
        r.idle_ms_per_token as idle_prefill_ms_per_token,
        r.idle_attn_ms_per_token2 as idle_prefill_attn_ms_per_token2,
        c.replica as chosen_replica,
        c.evidence_source,
        c.seen_waiting as c_seen_waiting,
        c.seen_running as c_seen_running,
        c.seen_pending as c_seen_pending,
        c.seen_kv_usage as c_seen_kv_usage,
        c.telemetry_age_ms as c_telemetry_age_ms,
        c.true_waiting as c_true_waiting,
        c.true_running as c_true_running,
        c.true_remaining_tokens as c_true_remaining_tokens,
        c.wait_est_ms as c_wait_est_ms,
        c.wait_nominal_ms as c_wait_nominal_ms,
        c.router_est_queue_ms as c_router_est_queue_ms,
        c.router_est_prefill_ms as c_router_est_prefill_ms,
        c.prefill_ms_per_token as c_prefill_ms_per_token,
        c.prefill_intercept_ms as c_prefill_intercept_ms,
        c.decode_ms_per_token as c_decode_ms_per_token,
        c.calibrated_from as c_calibrated_from,
        c.speed_factor as c_speed_factor,
        c.speed_from as c_speed_from,
        c.fleet_prefill_ms_per_token,
        c.fleet_prefill_intercept_ms,
        c.fleet_decode_ms_per_token,
        c.decided_at,
        c.decision_reason,
        c.decision_policy,
        c.exec_span_id,
        c.exec_queue_ms,
        c.exec_prefill_ms,
        c.exec_load_stretch_ms,
        c.exec_ttft_ms,
        c.exec_cached_tokens,
        c.exec_uncached_tokens,
        c.in_herding_episode,
        c.episode_rank,
        c.episode_decisions,
        c.episode_unreflected,
        c.unreflected_assignments,
        c.max_kv_usage_scraped,
        c.preemptions_nearby,
        c.has_prefix_hashes,
        c.prefix_last_served_at,
        c.exec_prefill_start_at,
        a.replica as alt_replica,
        a.seen_waiting as a_seen_waiting,
        a.seen_running as a_seen_running,
        a.true_running as a_true_running,
        a.seen_pending as a_seen_pending,
        a.true_waiting as a_true_waiting,
        a.wait_est_ms as a_wait_est_ms,
        a.wait_nominal_ms as a_wait_nominal_ms,
        a.prefill_est_ms as a_prefill_est_ms,
        a.ttft_est_ms as a_ttft_est_ms,
        a.cached_assumed_tokens as a_cached_tokens,
        a.router_est_queue_ms as a_router_est_queue_ms,
        a.router_est_prefill_ms as a_router_est_prefill_ms,
        a.cache_source as a_cache_source,
        a.load_source as a_load_source,
        c.cache_source as c_cache_source,
        p.policy_true_replica,
        p.policy_true_ttft_est_ms,
        p.policy_true_wait_est_ms,
        p.policy_true_wait_nominal_ms,
        p.policy_true_seen_load,
        p.policy_true_true_load,
        p.policy_true_router_est_queue_ms,
        p.policy_view_compares_counts,
        p.policy_score_replayed_as,
        sr.not_replayed as policy_score_not_replayed
    from request_level as r
    left join chosen as c
        on r.request_key = c.request_key
    left join best_alternative as a
        on r.request_key = a.request_key
    left join policy_choice_estimated as p
        on r.request_key = p.request_key
    left join score_replay_described as sr
        on r.request_key = sr.request_key
)

select * from final
