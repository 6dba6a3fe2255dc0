-- int_attr_requests_placed: one row per request (request_key): its final routing attempt summed
-- up from int_attr_candidates_estimated: the chosen candidate, the best alternative (lowest
-- estimated TTFT among the other eligible, observed candidates), the ideal placement (best cache
-- that existed, on a nominal idle replica) and the shortest wait any candidate had. It depends on
-- the attribution thresholds but not on the SLO, so refresh() also stores it at the default
-- thresholds: a reader with another SLO (the dashboard's sidebar) then judges its slow requests
-- against this table instead of re-assessing every candidate. attributions reads it.
with

estimated as (
    select * from int_attr_candidates_estimated
),

all_requests as (
    select
        request_key,
        input_tokens,
        predicted_cached_tokens
    from requests
),

thresholds as (
    select * from int_attr_thresholds
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
    from estimated as e
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
                'prefill_est_ms': prefill_est_ms,
                'ttft_est_ms': ttft_est_ms,
                'cached_assumed_tokens': cached_assumed_tokens,
                'router_est_queue_ms': router_est_queue_ms,
                'router_est_prefill_ms': router_est_prefill_ms
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

final as (
    select
        r.* exclude (idle_intercept_ms, idle_ms_per_token, idle_attn_ms_per_token2, input_tokens),
        r.idle_intercept_ms
        + r.idle_ms_per_token * (r.input_tokens - r.ideal_cached_tokens)
        + r.idle_attn_ms_per_token2 * (r.input_tokens - r.ideal_cached_tokens)
        * (r.ideal_cached_tokens + (r.input_tokens - r.ideal_cached_tokens) / 2.0)
            as ideal_prefill_ms,
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
        c.router_est_queue_ms as c_router_est_queue_ms,
        c.router_est_prefill_ms as c_router_est_prefill_ms,
        c.prefill_ms_per_token as c_prefill_ms_per_token,
        c.prefill_intercept_ms as c_prefill_intercept_ms,
        c.decode_ms_per_token as c_decode_ms_per_token,
        c.calibrated_from as c_calibrated_from,
        c.fleet_prefill_ms_per_token,
        c.fleet_prefill_intercept_ms,
        c.fleet_decode_ms_per_token,
        c.decided_at,
        c.decision_reason,
        c.decision_policy,
        c.exec_span_id,
        c.exec_queue_ms,
        c.exec_prefill_ms,
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
        a.prefill_est_ms as a_prefill_est_ms,
        a.ttft_est_ms as a_ttft_est_ms,
        a.cached_assumed_tokens as a_cached_tokens,
        a.router_est_queue_ms as a_router_est_queue_ms,
        a.router_est_prefill_ms as a_router_est_prefill_ms
    from request_level as r
    left join chosen as c
        on r.request_key = c.request_key
    left join best_alternative as a
        on r.request_key = a.request_key
)

select * from final
