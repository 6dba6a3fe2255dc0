-- attributions: one row per cause per request that needs explaining (a successful request that
-- missed a target, or a timeout). A request may have several causes; is_primary marks the one
-- with the largest excess_ms. excess_ms is the latency the cause cost: TTFT ms for TTFT causes,
-- decode ms ((TPOT - reference) * (output tokens - 1)) for TPOT causes. Every request that
-- needs explaining has at least one row: 'unknown' when the trace is complete and no rule
-- fires, 'incomplete_trace' when a side is missing. Requests are keyed by request_key (request
-- ids may repeat); request_id is shown. Rules and thresholds: docs/attribution.md.
with

requests_judged as (
    select * from int_attr_requests_judged
),

placed as (
    -- the final attempt of each request summed up (chosen, best alternative, ideal): a table at
    -- the default thresholds, whatever the SLO
    select * from int_attr_requests_placed
),

thresholds as (
    select * from int_attr_thresholds
),

client_gaps as (
    -- the client-minus-replica TTFT gap a request of the run normally has, over the window of
    -- the request's partition (a table: it depends on no setting, and a scoped computation
    -- still needs the window's other requests)
    select * from int_attr_client_gaps
),

request_level as (
    select
        j.request_key,
        j.request_id,
        j.run_id,
        j.status,
        j.missed,
        j.ttft_ms,
        j.tpot_ms,
        j.output_tokens,
        j.input_tokens,
        j.ttft_slo_ms,
        j.tpot_slo_ms,
        j.ttft_excess_ms,
        j.tpot_excess_ms,
        j.total_excess_ms,
        j.has_client,
        j.has_router,
        j.has_replica,
        coalesce(j.clock_suspect, false) as clock_suspect,
        j.replica_ttft_ms,
        j.predicted_cached_tokens as request_predicted_cached_tokens,
        j.actual_cached_tokens as request_actual_cached_tokens,
        j.served_by,
        j.router_id,
        j.policy,
        j.client_start,
        j.part,
        j.verdict_final,
        p.* exclude (request_key)
    from requests_judged as j
    inner join placed as p
        on j.request_key = p.request_key
    where j.needs_attribution
),

subjects as (
    select
        r.*,
        g.run_gap_p50_ms,
        coalesce(r.exec_ttft_ms, r.replica_ttft_ms) as actual_replica_ttft_ms,
        -- the router's prediction for the chosen replica of the final attempt
        r.request_predicted_cached_tokens as predicted_cached,
        coalesce(r.exec_cached_tokens, r.request_actual_cached_tokens) as actual_cached
    from request_level as r
    left join client_gaps as g
        on r.part = g.part
        and r.run_id is not distinct from g.run_id
),

speed_judged as (
    -- the chosen replica's speed relative to the fleet's when it is slow (null otherwise):
    -- measured on its prefills that ran alone against the idle fit (c_speed_from =
    -- 'solo_prefills', int_attr_candidates_estimated), slow when they took at least
    -- slow_replica_ratio times the prediction; else, calibrated on its own data, its fitted
    -- slope against the fleet median's
    select
        s.*,
        case
            when s.c_speed_from = 'solo_prefills'
                then case
                    when s.c_speed_factor >= t.slow_replica_ratio then 1.0 / s.c_speed_factor
                end
            when s.c_calibrated_from in ('replica', 'replica_ratio')
                and s.c_prefill_ms_per_token
                >= t.slow_replica_ratio * s.fleet_prefill_ms_per_token
                then s.fleet_prefill_ms_per_token / s.c_prefill_ms_per_token
        end as c_slow_speed
    from subjects as s
    cross join thresholds as t
),

eviction_counted as (
    select
        s.*,
        case
            when s.predicted_cached - coalesce(s.actual_cached, 0)
                >= t.cache_tolerance_tokens
                and s.exec_span_id is not null
                then s.predicted_cached - coalesce(s.actual_cached, 0)
            else 0
        end as evicted_tokens
    from speed_judged as s
    cross join thresholds as t
),

eviction_sized as (
    -- what the prefill of the evicted tokens cost: those tokens alone, after the prefix the
    -- replica did hold (the idle fit's per-token and attention terms, as every prefill
    -- estimate; no intercept: the prefill ran anyway), at the fleet's speed or, on a slow
    -- replica, at its own (per-replica measures differ by noise; only a slow replica is
    -- treated as different). A fit over every prefill learns steps shared with other work and
    -- overstates it
    select
        s.*,
        (
            coalesce(
                s.idle_prefill_ms_per_token, s.fleet_prefill_ms_per_token,
                s.c_prefill_ms_per_token, 0.0
            )
            * s.evicted_tokens
            + coalesce(s.idle_prefill_attn_ms_per_token2, 0.0) * s.evicted_tokens
            * (coalesce(s.actual_cached, 0) + s.evicted_tokens / 2.0)
        ) / coalesce(s.c_slow_speed, 1.0) as eviction_ms
    from eviction_counted as s
),

compared as (
    -- slowness first: on a slow replica the routing causes are credited only with what an
    -- alternative would have saved beyond the replica's slowness, from the TTFT there at the
    -- fleet's speed (its measured speed times the TTFT, the counterfactual slow_replica is
    -- sized from); the slowness itself is slow_replica's
    select
        s.*,
        -- what choosing the best alternative would have saved, beyond the eviction
        (s.actual_replica_ttft_ms - s.eviction_ms) * coalesce(s.c_slow_speed, 1.0)
        - s.a_ttft_est_ms as saving_ms,
        -- what the policy's own choice on the true state would have saved
        (s.actual_replica_ttft_ms - s.eviction_ms) * coalesce(s.c_slow_speed, 1.0)
        - s.policy_true_ttft_est_ms as stale_saving_ms,
        -- load = waiting + running (+ pending assignments the router knew of)
        s.c_seen_waiting + coalesce(s.c_seen_running, 0)
        + coalesce(s.c_seen_pending, 0) as c_seen_load,
        s.a_seen_waiting + coalesce(s.a_seen_running, 0)
        + coalesce(s.a_seen_pending, 0) as a_seen_load,
        s.c_true_waiting + s.c_true_running as c_true_load,
        s.a_true_waiting + s.a_true_running as a_true_load
    from eviction_sized as s
),

judged as (
    select
        s.*,
        s.ttft_excess_ms > 0
        and s.saving_ms >= t.misroute_min_ms
        and (
            s.saving_ms >= t.misroute_min_frac * s.actual_replica_ttft_ms
            or s.ttft_ms - s.saving_ms <= s.ttft_slo_ms
        ) as is_misrouted,
        -- the router's view flipped the choice: in its own view the chosen replica was at
        -- least as good as the best alternative A, on the true load (the router's cache view
        -- kept) A was better, and the view of the chosen replica's (or A's) load was
        -- materially wrong.
        -- With the router's Q/P estimates the comparison is Q+P against true wait + P (the
        -- policy's own terms; the wait at the fleet's speed, wait_nominal_ms: the router's
        -- estimates know the load, not a replica's speed); without them, load = waiting +
        -- running (+ pending).
        coalesce(case
            -- the policy is known: re-run on the true state it chose another replica, and that
            -- choice's saving alone is material (the misrouting rule's bar)
            when s.policy_true_replica is not null
                then
                    s.policy_true_replica <> s.chosen_replica
                    -- the view of the chosen replica, or of the one chosen on the true state,
                    -- was materially wrong (its load, or the router's queue estimate)
                    and (
                        -- a rule comparing request counts gave the chosen replica on the
                        -- counts the router saw and another on the true ones: the counts it
                        -- compared differed, by however little
                        s.policy_view_compares_counts
                        or abs(s.c_true_load - s.c_seen_load) >= t.stale_min_gap
                        or abs(s.policy_true_true_load - s.policy_true_seen_load)
                        >= t.stale_min_gap
                        or (s.in_herding_episode and s.c_true_load > s.c_seen_load)
                        or abs(s.c_wait_nominal_ms - s.c_router_est_queue_ms)
                        >= t.misroute_min_ms
                        or abs(s.policy_true_wait_nominal_ms - s.policy_true_router_est_queue_ms)
                        >= t.misroute_min_ms
                    )
                    and s.stale_saving_ms >= t.misroute_min_ms
                    and (
                        s.stale_saving_ms >= t.misroute_min_frac * s.actual_replica_ttft_ms
                        or s.ttft_ms - s.stale_saving_ms <= s.ttft_slo_ms
                    )
            when s.c_router_est_queue_ms is not null and s.a_router_est_queue_ms is not null
                then
                    -- (estimates within estimate_tolerance_ms of each other are equal)
                    s.c_router_est_queue_ms + coalesce(s.c_router_est_prefill_ms, 0.0)
                    <= s.a_router_est_queue_ms + coalesce(s.a_router_est_prefill_ms, 0.0)
                    + t.estimate_tolerance_ms
                    and s.c_wait_nominal_ms + coalesce(s.c_router_est_prefill_ms, 0.0)
                    > s.a_wait_nominal_ms + coalesce(s.a_router_est_prefill_ms, 0.0)
                    + t.estimate_tolerance_ms
                    and (
                        s.c_wait_nominal_ms - s.c_router_est_queue_ms >= t.misroute_min_ms
                        or s.c_true_load - s.c_seen_load >= t.stale_min_gap
                        or (s.in_herding_episode and s.c_true_load > s.c_seen_load)
                        -- or A looked busier than it was (it had drained since the sample)
                        or s.a_router_est_queue_ms - s.a_wait_nominal_ms >= t.misroute_min_ms
                    )
            else
                s.c_seen_load <= s.a_seen_load
                and s.c_true_load > s.a_true_load
                and (
                    abs(s.c_true_load - s.c_seen_load) >= t.stale_min_gap
                    or (s.in_herding_episode and s.c_true_load > s.c_seen_load)
                )
        end, false) as view_was_stale,
        -- the wait, not the prefill, made the difference (within the tolerance: the wait)
        -- (the prefill's stretch by the work present is the wait's)
        coalesce(s.exec_queue_ms, 0) + coalesce(s.exec_load_stretch_ms, 0) - s.a_wait_est_ms
        >= coalesce(s.exec_prefill_ms, 0) - coalesce(s.exec_load_stretch_ms, 0)
        - s.eviction_ms
        - s.a_prefill_est_ms - t.estimate_tolerance_ms as wait_decided,
        -- the policy weighs replica load (docs/attribution.md lists them)
        coalesce(
            lower(coalesce(s.decision_policy, s.policy)) in (
                'least_load', 'least_loaded', 'least_request', 'least_requests',
                'power_of_two', 'qp_cost'
            ),
            false
        ) as policy_reads_load,
        -- the alternative held more of the prompt's prefix than the chosen replica had
        coalesce(s.a_cached_tokens, 0)
        >= coalesce(s.actual_cached, 0) + t.cache_tolerance_tokens as alt_held_prefix,
        least(
            s.actual_replica_ttft_ms - s.eviction_ms,
            coalesce(s.a_ttft_est_ms, cast('infinity' as double))
        ) as best_available_ms,
        s.ttft_ms - s.replica_ttft_ms as client_gap_ms
    from compared as s
    cross join thresholds as t
),

routing_judged as (
    select
        j.*,
        case
            when j.view_was_stale and j.in_herding_episode then 'herding'
            when j.view_was_stale and j.c_telemetry_age_ms >= t.stale_age_ms then 'stale_view'
            -- fresh telemetry, but assignments since (own or other routers') not reflected
            when j.view_was_stale then 'unreflected_load'
        end as stale_kind,
        case
            when (j.c_router_est_queue_ms is not null
                or j.c_router_est_prefill_ms is not null)
                and coalesce(j.c_router_est_queue_ms, 0) + coalesce(j.c_router_est_prefill_ms, 0)
                <= coalesce(j.a_router_est_queue_ms, 0) + coalesce(j.a_router_est_prefill_ms, 0)
                + t.estimate_tolerance_ms
                then 'policy_estimate'
            -- a policy that weighs load, on a view that was right, still misjudged the work
            when j.wait_decided and j.policy_reads_load then 'load_misjudged'
            when j.wait_decided then 'load_blind'
            when j.alt_held_prefix then 'cache_blind'
            -- both held the prefix (or neither): the alternative prefills faster
            else 'speed_blind'
        end as misroute_kind,
        case
            when j.policy_true_replica is not null
                then printf(
                    'on the true state its policy (%s) would have chosen %s: est %.0f ms vs '
                    || 'actual %.0f ms; ',
                    coalesce(lower(j.decision_policy), 'unnamed')
                    || coalesce(', ' || j.policy_score_replayed_as, ''),
                    j.policy_true_replica,
                    j.policy_true_ttft_est_ms,
                    j.actual_replica_ttft_ms
                )
            -- a router-declared score that could not be replayed says why
            when j.policy_score_not_replayed is not null
                then printf(
                    'its policy (%s) not replayed on the true state: %s; ',
                    coalesce(lower(j.decision_policy), 'unnamed'),
                    j.policy_score_not_replayed
                )
            else ''
        end as replay_evidence,
        printf(
            '%s: true waiting=%d, est wait %.0f ms + prefill %.0f ms (%d cached, from %s; '
            || 'load from %s) = %.0f ms vs actual %.0f ms',
            j.alt_replica,
            j.a_true_waiting,
            j.a_wait_est_ms,
            j.a_prefill_est_ms,
            j.a_cached_tokens,
            replace(coalesce(j.a_cache_source, '?'), '_', ' '),
            replace(coalesce(j.a_load_source, '?'), '_', ' '),
            j.a_ttft_est_ms,
            j.actual_replica_ttft_ms
        )
        || case
            when j.c_slow_speed is not null
                then printf(
                    ' (routing judged beyond the slowness: %.0f ms at the fleet''s speed)',
                    j.actual_replica_ttft_ms * j.c_slow_speed
                )
            else ''
        end as alt_evidence
    from judged as j
    cross join thresholds as t
    where j.is_misrouted
),

cause_misrouting as (
    -- the view flipped the choice: stale telemetry, sized by what the policy's own true-state
    -- choice saves (or, for a policy that cannot be re-run, by the best alternative's saving)
    select
        request_key,
        'stale_telemetry' as cause,
        stale_kind as sub_kind,
        coalesce(stale_saving_ms, saving_ms) as excess_ms,
        0.8 as base_confidence,
        replay_evidence
        || printf(
            'router saw waiting=%s running=%s (pending %s) on %s at age %s ms; '
            || 'true waiting was %s, running %s. ',
            coalesce(printf('%.0f', c_seen_waiting), '?'),
            coalesce(printf('%.0f', c_seen_running), '?'),
            coalesce(cast(c_seen_pending as varchar), '?'),
            chosen_replica,
            coalesce(printf('%.0f', c_telemetry_age_ms), '?'),
            cast(c_true_waiting as varchar),
            cast(c_true_running as varchar)
        )
        || case
            when in_herding_episode then printf(
                'decision %d of %d on that telemetry sample; '
                || '%d earlier assignments unreflected in its view. ',
                episode_rank, episode_decisions, unreflected_assignments
            )
            else ''
        end
        || alt_evidence as evidence
    from routing_judged
    where view_was_stale
    union all
    -- another replica would have met it: misrouting, beyond the stale choice when there was one
    select
        request_key,
        'misrouting' as cause,
        misroute_kind as sub_kind,
        case
            when view_was_stale then policy_true_ttft_est_ms - a_ttft_est_ms
            else saving_ms
        end as excess_ms,
        case
            when c_router_est_queue_ms is not null
                or c_router_est_prefill_ms is not null then 0.7
            when wait_decided and policy_reads_load then 0.7
            when wait_decided then 0.8
            else 0.6
        end as base_confidence,
        replay_evidence
        || printf(
            'router chose %s (reason %s): true waiting=%d, running=%d, remaining=%.0f tokens; ',
            chosen_replica,
            coalesce(decision_reason, '?'),
            c_true_waiting,
            c_true_running,
            c_true_remaining_tokens
        )
        || alt_evidence as evidence
    from routing_judged
    where not view_was_stale or policy_true_replica is not null
),

cause_eviction as (
    select
        request_key,
        'eviction' as cause,
        case
            when has_prefix_hashes and prefix_last_served_at is not null
                then 'evicted_after_decision'
            when has_prefix_hashes then 'never_cached'
            when greatest(
                coalesce(max_kv_usage_scraped, 0), coalesce(c_seen_kv_usage, 0)
            ) >= t.kv_pressure
            or preemptions_nearby > 0
                then 'evicted_after_decision'
            else 'never_cached'
        end as sub_kind,
        eviction_ms as excess_ms,
        case
            when has_prefix_hashes then 0.8
            when greatest(
                coalesce(max_kv_usage_scraped, 0), coalesce(c_seen_kv_usage, 0)
            ) >= t.kv_pressure
            or preemptions_nearby > 0
                then 0.6
            else 0.4
        end as base_confidence,
        printf(
            'router predicted %d cached tokens on %s; replica reported %d at prefill: %d extra tokens, '
            || '%.0f ms to prefill alone after the %d held',
            predicted_cached,
            chosen_replica,
            coalesce(actual_cached, 0),
            evicted_tokens,
            eviction_ms,
            coalesce(actual_cached, 0)
        )
        || case
            when has_prefix_hashes and prefix_last_served_at is not null
                then printf(
                    '; a request sharing the prefix had its prefill there %.0f ms before this prefill',
                    date_diff(
                        'microsecond', prefix_last_served_at,
                        coalesce(exec_prefill_start_at, decided_at)
                    ) / 1000.0
                )
            when has_prefix_hashes
                then '; no earlier request sharing the prefix was served there'
            else ''
        end
        || printf(
            '; max KV usage %s, preemptions nearby %d',
            coalesce(
                printf(
                    '%.2f',
                    greatest(max_kv_usage_scraped, c_seen_kv_usage)
                ),
                'unknown'
            ),
            preemptions_nearby
        ) as evidence
    from judged
    cross join thresholds as t
    where ttft_excess_ms > 0 and evicted_tokens > 0
),

cause_overload as (
    -- even the best placement would have waited: the smallest estimated wait over every
    -- eligible candidate (the chosen one included) is what the load cost
    select
        request_key,
        'overload' as cause,
        cast(null as varchar) as sub_kind,
        -- at most what the load cost this request: its own wait (queued, else estimated, and
        -- the stretch of its prefill by the work present); an estimate of the best
        -- placement's wait above what it measurably waited is the estimate's error
        least(
            min_wait_ms,
            coalesce(exec_queue_ms, c_wait_est_ms) + coalesce(exec_load_stretch_ms, 0.0)
        ) as excess_ms,
        0.7 as base_confidence,
        printf(
            'every eligible candidate was busy: the shortest estimated wait was %.0f ms (%s) '
            || 'over %d candidates; this request queued %.0f ms and its prefill was stretched '
            || '%.0f ms by the work present; TTFT %.0f ms vs SLO %.0f ms',
            min_wait_ms,
            coalesce(min_wait_replica, chosen_replica),
            candidates,
            coalesce(exec_queue_ms, c_wait_est_ms),
            coalesce(exec_load_stretch_ms, 0.0),
            ttft_ms,
            ttft_slo_ms
        ) as evidence
    from judged
    cross join thresholds as t
    where
        ttft_excess_ms > 0
        and chosen_replica is not null
        and eligible_unobserved = 0
        and min_wait_ms > 0
        -- the load must have cost this request: its own wait was not short, queued (measured,
        -- else estimated) or admitted at once with its prefill sharing steps with the work
        -- present (the stretch that work caused); a request that did neither never gets it
        and coalesce(exec_queue_ms, c_wait_est_ms) + coalesce(exec_load_stretch_ms, 0.0)
        >= t.overload_min_queue_ms
),

cause_long_prompt as (
    -- the part of the best achievable TTFT (a nominal idle replica holding the best cache that
    -- existed) above the TTFT SLO: what no placement could have saved; only when that ideal
    -- itself misses the SLO
    select
        request_key,
        'long_prompt' as cause,
        cast(null as varchar) as sub_kind,
        ideal_prefill_ms - ttft_slo_ms as excess_ms,
        0.8 as base_confidence,
        printf(
            'input %d tokens: even idle, the best replica (%s) needs %.0f ms of prefill, '
            || '%.0f ms over the TTFT SLO of %.0f ms',
            input_tokens,
            ideal_replica,
            ideal_prefill_ms,
            ideal_prefill_ms - ttft_slo_ms,
            ttft_slo_ms
        ) as evidence
    from judged
    where
        ttft_excess_ms > 0
        and ideal_prefill_ms > ttft_slo_ms
),

cause_slow_replica as (
    select
        request_key,
        'slow_replica' as cause,
        'prefill' as sub_kind,
        -- everything on a replica running at speed s takes 1/s as long: queue and prefill
        -- alike
        actual_replica_ttft_ms * (1.0 - c_slow_speed) as excess_ms,
        0.6 as base_confidence,
        case
            when c_speed_from = 'solo_prefills'
                then printf(
                    '%s runs at %.2f of the fleet''s speed: its prefills that ran alone took '
                    || '%.2f times what the idle fit predicts; this prefill %.0f ms for %d '
                    || 'uncached tokens',
                    chosen_replica,
                    c_slow_speed,
                    c_speed_factor,
                    exec_prefill_ms,
                    exec_uncached_tokens
                )
            else printf(
                '%s prefills at %.3f ms/token vs fleet median %.3f; this prefill %.0f ms for %d uncached tokens',
                chosen_replica,
                c_prefill_ms_per_token,
                fleet_prefill_ms_per_token,
                exec_prefill_ms,
                exec_uncached_tokens
            )
        end as evidence
    from judged
    where
        ttft_excess_ms > 0
        and c_slow_speed is not null
    union all
    select
        request_key,
        'slow_replica' as cause,
        'decode' as sub_kind,
        (tpot_ms - fleet_decode_ms_per_token) * (output_tokens - 1) as excess_ms,
        0.6 as base_confidence,
        printf(
            '%s decodes at %.1f ms/token vs fleet median %.1f; TPOT %.1f ms > SLO %.0f ms',
            chosen_replica,
            c_decode_ms_per_token,
            fleet_decode_ms_per_token,
            tpot_ms,
            tpot_slo_ms
        ) as evidence
    from judged
    cross join thresholds as t
    where
        tpot_excess_ms > 0
        and output_tokens >= 2
        and c_decode_ms_per_token
        >= t.slow_decode_ratio * fleet_decode_ms_per_token
),

cause_client_network as (
    select
        request_key,
        'client_network' as cause,
        cast(null as varchar) as sub_kind,
        client_gap_ms - greatest(coalesce(run_gap_p50_ms, 0.0), 0.0) as excess_ms,
        0.7 as base_confidence,
        printf(
            'client TTFT %.0f ms vs replica TTFT %.0f ms: %.0f ms outside the replica (run median %.0f ms)',
            ttft_ms,
            replica_ttft_ms,
            client_gap_ms,
            coalesce(run_gap_p50_ms, 0.0)
        ) as evidence
    from judged
    cross join thresholds as t
    where
        ttft_excess_ms > 0
        and has_client
        and client_gap_ms >= t.client_gap_min_ms
        and client_gap_ms >= t.client_gap_ratio * replica_ttft_ms
),

causes_found as (
    select * from cause_misrouting
    union all
    select * from cause_eviction
    union all
    select * from cause_overload
    union all
    select * from cause_long_prompt
    union all
    select * from cause_slow_replica
    union all
    select * from cause_client_network
),

causes_kept as (
    select f.*
    from causes_found as f
    cross join thresholds as t
    inner join request_level as r
        on f.request_key = r.request_key
    where
        f.excess_ms >= greatest(t.cause_min_ms, t.cause_min_frac * coalesce(r.ttft_ms, 0.0))
        and not isnan(f.excess_ms)
),

explained as (
    select
        request_key,
        count(*) as causes,
        max(excess_ms) as max_excess_ms
    from causes_kept
    group by all
),

cause_missing_evidence as (
    select
        j.request_key,
        case
            when j.exec_span_id is null and j.replica_ttft_ms is null
                then 'incomplete_trace'
            when not j.has_decision then 'incomplete_trace'
            else 'unknown'
        end as cause,
        case
            when j.exec_span_id is null and j.replica_ttft_ms is null
                then 'replica_side_missing'
            when not j.has_decision then 'router_side_missing'
        end as sub_kind,
        j.total_excess_ms - coalesce(e.max_excess_ms, 0.0) as excess_ms,
        0.0 as base_confidence,
        case
            when j.exec_span_id is null and j.replica_ttft_ms is null
                then printf(
                    'no replica span for this request (client seen: %s, router seen: %s): '
                    || 'queue and prefill cannot be rebuilt',
                    coalesce(cast(j.has_client as varchar), '?'),
                    coalesce(cast(j.has_router as varchar), '?')
                )
            when not j.has_decision
                then 'no routing decision recorded or linked: the choice cannot be judged'
            else printf(
                'no rule explains %.0f ms over the SLO (missed %s)',
                j.total_excess_ms,
                coalesce(j.missed, j.status)
            )
        end as evidence
    from judged as j
    left join explained as e
        on j.request_key = e.request_key
    where
        -- a missing side is always said; 'unknown' only when nothing else was found
        (j.exec_span_id is null and j.replica_ttft_ms is null)
        or not j.has_decision
        or e.request_key is null
),

all_causes as (
    select * from causes_kept
    union all
    select * from cause_missing_evidence
),

final as (
    select
        s.request_id,
        s.run_id,
        c.cause,
        c.sub_kind,
        round(greatest(c.excess_ms, 0.0), 1) as excess_ms,
        -- excesses within estimate_tolerance_ms are equal; then a stable order of the rows
        row_number() over (
            partition by s.request_key
            order by
                round(c.excess_ms / t.estimate_tolerance_ms) desc,
                c.cause not in ('unknown', 'incomplete_trace') desc,
                c.cause asc,
                c.sub_kind asc nulls first,
                c.evidence asc
        ) = 1 as is_primary,
        round(
            c.base_confidence
            * case when s.evidence_source = 'reconstructed' then 0.75 else 1.0 end
            * case when s.clock_suspect then 0.5 else 1.0 end,
            2
        ) as confidence,
        c.evidence,
        -- no decision at all (router side missing): no routing evidence, recorded or rebuilt
        coalesce(s.evidence_source, 'none') as evidence_source,
        s.status,
        s.missed,
        s.ttft_ms,
        s.tpot_ms,
        s.total_excess_ms as over_slo_ms,
        coalesce(s.chosen_replica, s.served_by) as replica,
        s.router_id,
        s.policy,
        s.client_start,
        -- the request's unique key (request ids repeat across runs): see requests
        s.request_key,
        s.part,
        s.verdict_final
    from all_causes as c
    cross join thresholds as t
    inner join subjects as s
        on c.request_key = s.request_key
)

select * from final
