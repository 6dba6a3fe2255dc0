-- int_attr_candidates_estimated: one row per candidate replica per routing decision (plus one
-- row for a request with no decision or no candidate): the candidate's TRUE state at the decision
-- instant (int_attr_candidates_state, a materialised table) with what depends on the attribution
-- thresholds but not on the SLO: the calibration choice, the estimated wait, prefill and TTFT
-- there, KV pressure within lookback and herding membership. A candidate is calibrated with the
-- fits of its request's partition and run (int_attr_replica_fits: learnt from that partition's
-- window), and compared with the fleet medians of the same (partition, run).
-- int_attr_candidates_assessed joins it to the SLO judgement; int_attr_requests_placed sums it
-- up per request. docs/attribution.md has the formulas.
with

all_requests as (
    select
        request_key,
        run_id,
        part,
        input_tokens
    from requests
),

state as not materialized (
    -- read twice below; two scans of the table are cheaper than DuckDB's default of
    -- materialising a CTE read twice (8M rows copied: the slow page at a live SLO 8.1 → 7.0 s)
    select * from int_attr_candidates_state
    -- the scope of int_attr_requests_judged (the state is keyed by request)
    where
        (
            getvariable('routeaudit_scope_run') is null
            or request_key in (
                select request_key from requests
                where run_id = getvariable('routeaudit_scope_run')
            )
        )
        and (
            getvariable('routeaudit_scope_request') is null
            or request_key in (
                select request_key from requests
                where request_id = getvariable('routeaudit_scope_request')
            )
        )
),

fits as (
    select * from int_attr_replica_fits
),

thresholds as (
    select * from int_attr_thresholds
),

calibration_chosen_fit as (
    select
        p.*,
        case
            when p.prefill_n >= t.calibration_min_n and p.fit_slope > 0
                then 'replica'
            when p.prefill_n >= t.calibration_min_n and p.fit_ratio > 0
                then 'replica_ratio'
            when p.pooled_slope > 0 then 'fleet'
            else 'fleet_ratio'
        end as calibrated_from
    from fits as p
    cross join thresholds as t
),

calibration_replicas as (
    select
        part,
        run_id,
        replica,
        calibrated_from,
        case calibrated_from
            when 'replica' then fit_slope
            when 'replica_ratio' then fit_ratio
            when 'fleet' then pooled_slope
            else pooled_ratio
        end as prefill_ms_per_token,
        case calibrated_from
            when 'replica' then greatest(fit_intercept, 0.0)
            when 'fleet' then greatest(pooled_intercept, 0.0)
            else 0.0
        end as prefill_intercept_ms,
        coalesce(decode_ms_per_token, pooled_decode_ms_per_token)
            as decode_ms_per_token,
        -- its prefill time relative to the window's median replica (the scale the idle fit
        -- removed from its points), when it has the points to say; else nominal
        case
            when prefill_n >= t.calibration_min_n
                then fit_ratio / nullif(median(fit_ratio) over (partition by part, run_id), 0)
        end as ratio_speed_factor,
        solo_n,
        solo_prefill_ms,
        solo_uncached_tokens,
        solo_attn_tokens2
    from calibration_chosen_fit
    cross join thresholds as t
),

calibration_fleet as (
    -- the medians over the replicas calibrated in the same (partition, run) window
    select
        c.part,
        c.run_id,
        median(c.prefill_ms_per_token) as fleet_prefill_ms_per_token,
        median(c.prefill_intercept_ms) as fleet_prefill_intercept_ms,
        median(c.decode_ms_per_token) as fleet_decode_ms_per_token,
        -- the idle reference (long_prompt): the run's idle fit when it has the points,
        -- else the fleet median fit (which includes sharing steps with other requests)
        any_value(
            case
                when i.idle_n >= t.calibration_min_n and i.idle_slope > 0
                    then i.idle_slope
            end
        ) as idle_prefill_ms_per_token,
        any_value(
            case
                when i.idle_n >= t.calibration_min_n and i.idle_slope > 0
                    then greatest(i.idle_intercept, 0.0)
            end
        ) as idle_prefill_intercept_ms,
        any_value(
            case
                when i.idle_n >= t.calibration_min_n and i.idle_slope > 0
                    then greatest(i.idle_attn_ms_per_token2, 0.0)
            end
        ) as idle_prefill_attn_ms_per_token2
    from calibration_replicas as c
    cross join thresholds as t
    left join (
        select distinct
            part,
            run_id,
            idle_n,
            idle_slope,
            idle_intercept,
            idle_attn_ms_per_token2
        from fits
    ) as i
        on c.part = i.part
        and c.run_id is not distinct from i.run_id
    group by all
),

calibration_speeds as (
    -- a replica's speed: its prefills that ran alone (nothing queued or prefilling at their
    -- decision, no step shared with another prefill) against what the run's idle fit, at the
    -- fleet's median speed, predicts for the same prompts (a sum of predictions is the fit at
    -- the sums of its regressors). Timed alone, a prefill shows the replica's own speed; a fit
    -- or ratio over every prefill also learns the steps shared with other work, and a slow
    -- replica, holding its work longer, shares more (in the testbed, a replica at 0.4x looked
    -- 0.34x-0.36x by ratio or slope, 0.39x-0.40x alone). Without calibration_min_n such
    -- prefills or without an idle fit: its Σprefill/Σuncached over the median replica's
    select
        c.* exclude (ratio_speed_factor, solo_n, solo_prefill_ms, solo_uncached_tokens,
                     solo_attn_tokens2),
        case
            when c.solo_n >= t.calibration_min_n and f.idle_prefill_ms_per_token is not null
                then 'solo_prefills'
            when c.ratio_speed_factor is not null then 'prefill_ratio'
        end as speed_from,
        case
            when c.solo_n >= t.calibration_min_n and f.idle_prefill_ms_per_token is not null
                then c.solo_prefill_ms / nullif(
                    c.solo_n * f.idle_prefill_intercept_ms
                    + f.idle_prefill_ms_per_token * c.solo_uncached_tokens
                    + f.idle_prefill_attn_ms_per_token2 * c.solo_attn_tokens2,
                    0.0
                )
            else c.ratio_speed_factor
        end as speed_factor
    from calibration_replicas as c
    cross join thresholds as t
    left join calibration_fleet as f
        on c.part = f.part
        and c.run_id is not distinct from f.run_id
),

scrapes as (
    select * from int_attr_replica_scrapes
),

waits_capped as (
    -- on the replica that ran the request, the work present whose first token came after the
    -- request's prefill started shared those steps with the request's own chunks (a step's
    -- time grows with the tokens it computes), so its measured first token counts part of the
    -- request's own prefill: the drain there is at most the time to the request's prefill
    -- start plus the prefill tokens that work had left then (drain_shared_tokens) computed
    -- alone (the idle fit, at the replica's speed). Without an idle fit the measured drain
    -- stands. One row per (decision, replica) with such work
    select distinct
        s.request_key,
        s.attempt,
        s.decision_span_id,
        s.replica,
        greatest(
            s.wait_est_ms - greatest(
                s.drain_ms - (
                    date_diff('microsecond', s.decided_at, s.exec_prefill_start_at) / 1000.0
                    + coalesce(c.speed_factor, 1.0) * (
                        f.idle_prefill_intercept_ms
                        + f.idle_prefill_ms_per_token * s.drain_shared_tokens
                        + f.idle_prefill_attn_ms_per_token2 * s.drain_shared_tokens
                        * s.drain_shared_tokens / 2.0
                    )
                ),
                0.0
            ),
            0.0
        ) as wait_est_ms
    from state as s
    inner join all_requests as j
        on s.request_key = j.request_key
    inner join calibration_fleet as f
        on j.part = f.part
        and j.run_id is not distinct from f.run_id
    left join calibration_speeds as c
        on j.part = c.part
        and j.run_id is not distinct from c.run_id
        and s.replica = c.replica
    where s.drain_shared_tokens is not null and f.idle_prefill_ms_per_token is not null
),

decisions as (
    select distinct
        request_key,
        attempt,
        decision_span_id,
        decided_at,
        decision_replica,
        exec_prefill_start_at
    from state
    where decided_at is not null
),

kv_pressure as (
    -- KV usage of the chosen replica between lookback before the decision and the prefill
    select
        d.request_key,
        d.attempt,
        d.decision_span_id,
        max(s.kv_usage) as max_kv_usage_scraped
    from decisions as d
    cross join thresholds as t
    inner join scrapes as s
        on d.decision_replica = s.replica
        and s.scraped_at
        >= d.decided_at - to_microseconds(cast(t.lookback_ms * 1000 as bigint))
        and s.scraped_at <= coalesce(d.exec_prefill_start_at, d.decided_at)
    group by all
),

estimated as (
    select
        s.* exclude (cached_assumed_tokens, cache_source, wait_est_ms),
        coalesce(w.wait_est_ms, s.wait_est_ms) as wait_est_ms,
        -- an alternative's cache is its own prefix history, bounded by its turnover and room
        -- (int_attr_candidates_state), never capped at the router's prediction, even where
        -- its KV usage was high: an index that keeps one replica per prefix predicts 0 where
        -- the replica still holds it
        s.cached_assumed_tokens,
        s.cache_source,
        j.input_tokens,
        coalesce(
            s.episode_decisions >= t.herding_min_decisions
            and s.episode_unreflected > 0
            and s.unreflected_assignments > 0,
            false
        ) as in_herding_episode,
        k.max_kv_usage_scraped,
        case when s.replica is not null then coalesce(c.calibrated_from, 'fleet_median') end
            as calibrated_from,
        coalesce(c.prefill_ms_per_token, f.fleet_prefill_ms_per_token)
            as prefill_ms_per_token,
        coalesce(c.prefill_intercept_ms, f.fleet_prefill_intercept_ms, 0.0)
            as prefill_intercept_ms,
        coalesce(c.decode_ms_per_token, f.fleet_decode_ms_per_token)
            as decode_ms_per_token,
        f.fleet_prefill_ms_per_token,
        f.fleet_prefill_intercept_ms,
        f.fleet_decode_ms_per_token,
        coalesce(f.idle_prefill_ms_per_token, f.fleet_prefill_ms_per_token)
            as idle_prefill_ms_per_token,
        coalesce(f.idle_prefill_intercept_ms, f.fleet_prefill_intercept_ms)
            as idle_prefill_intercept_ms,
        coalesce(f.idle_prefill_attn_ms_per_token2, 0.0) as idle_prefill_attn_ms_per_token2,
        f.idle_prefill_ms_per_token is not null and s.replica is not null as has_idle_fit,
        coalesce(c.speed_factor, 1.0) as speed_factor,
        case when s.replica is not null then c.speed_from end as speed_from,
        -- a replica treated as running at another speed than the fleet's: by
        -- slow_replica_ratio or more either way (per-replica measures differ by noise)
        coalesce(
            c.speed_factor >= t.slow_replica_ratio
            or c.speed_factor <= 1.0 / t.slow_replica_ratio,
            false
        ) as speed_differs,
        coalesce(ce.speed_factor, 1.0) as exec_speed_factor
    from all_requests as j
    cross join thresholds as t
    inner join state as s
        on j.request_key = s.request_key
    left join waits_capped as w
        on s.request_key = w.request_key
        and s.attempt is not distinct from w.attempt
        and s.decision_span_id is not distinct from w.decision_span_id
        and s.replica = w.replica
    left join kv_pressure as k
        on s.request_key = k.request_key
        and s.attempt is not distinct from k.attempt
        and s.decision_span_id is not distinct from k.decision_span_id
    left join calibration_speeds as c
        on j.part = c.part
        and j.run_id is not distinct from c.run_id
        and s.replica = c.replica
    left join calibration_speeds as ce
        on j.part = ce.part
        and j.run_id is not distinct from ce.run_id
        and s.exec_replica = ce.replica
    left join calibration_fleet as f
        on j.part = f.part
        and j.run_id is not distinct from f.run_id
        and s.replica is not null
),

uncached as (
    select
        *,
        greatest(coalesce(input_tokens, 0) - cached_assumed_tokens, 0) as uncached_est_tokens
    from estimated
),

prefill_modelled as (
    -- the prompt alone on that replica: the idle fit (prefills that ran alone: no step shared
    -- with other work, attention growing with position) at its speed relative to the median
    -- replica; and the same for the execution the decision led to, with the cache it reported
    select
        *,
        case
            when has_idle_fit
                then speed_factor * (
                    idle_prefill_intercept_ms
                    + idle_prefill_ms_per_token * uncached_est_tokens
                    + idle_prefill_attn_ms_per_token2 * uncached_est_tokens
                    * (cached_assumed_tokens + uncached_est_tokens / 2.0)
                )
        end as prefill_alone_ms,
        case
            when has_idle_fit and exec_uncached_tokens > 0
                then exec_speed_factor * (
                    idle_prefill_intercept_ms
                    + idle_prefill_ms_per_token * exec_uncached_tokens
                    + idle_prefill_attn_ms_per_token2 * exec_uncached_tokens
                    * (exec_cached_tokens + exec_uncached_tokens / 2.0)
                )
        end as exec_prefill_alone_ms
    from uncached
),

exec_waits as (
    -- the wait the work present at the decision put on the replica that ran it (its estimate
    -- on that replica's row of the same decision; a replica listed twice: the longer)
    select
        s.request_key,
        s.attempt,
        s.decision_span_id,
        max(coalesce(w.wait_est_ms, s.wait_est_ms)) as exec_wait_est_ms,
        max(s.seen_kv_usage) as exec_seen_kv_usage
    from state as s
    left join waits_capped as w
        on s.request_key = w.request_key
        and s.attempt is not distinct from w.attempt
        and s.decision_span_id is not distinct from w.decision_span_id
        and s.replica = w.replica
    where s.replica = s.exec_replica
    group by all
),

prefill_estimated as (
    -- what the prefill would have taken there: the prompt alone there, plus the time this
    -- prompt's measured prefill took beyond it alone on the replica that ran it, less the part
    -- of the wait for the work present at the decision that it did not spend queued (a
    -- scheduler that admits at once shares the steps with that work instead: its load, not the
    -- prompt). What remains (steps shared with requests that came later, the model's error for
    -- this prompt) would have met it elsewhere too. A fit over every prefill learns the time
    -- of prefills sharing steps with others instead, and overstated an alternative's prefill
    -- by a median 40 %; it is the estimate only when the window has no idle fit. A prompt
    -- preempted there, or prefilled while that replica's KV cache was near full, spent part
    -- of that time losing, recomputing or waiting for blocks, which is that replica's memory,
    -- not the prompt's: the other replicas get the prompt alone
    select
        m.*,
        w.exec_wait_est_ms,
        w.exec_seen_kv_usage,
        case
            when prefill_alone_ms is null
                then prefill_intercept_ms + prefill_ms_per_token * uncached_est_tokens
            when exec_prefill_ms > 0 and exec_prefill_alone_ms > 0
                and (
                    m.replica = m.exec_replica
                    or (
                        coalesce(m.exec_preemptions, 0) = 0
                        and coalesce(
                            greatest(m.max_kv_usage_scraped, w.exec_seen_kv_usage)
                            < t.kv_pressure,
                            true
                        )
                    )
                )
                then prefill_alone_ms + greatest(
                    exec_prefill_ms - exec_prefill_alone_ms
                    - greatest(coalesce(exec_wait_est_ms, 0.0) - coalesce(exec_queue_ms, 0.0), 0.0),
                    0.0
                )
            else prefill_alone_ms
        end as prefill_there_ms,
        -- the part of that stretch the work present at the decision caused on the replica
        -- that ran it: a scheduler that admits at once shows the wait as a longer prefill, and
        -- it is the request's own wait as much as a queue (the overload rule reads it)
        case
            when exec_prefill_ms > 0 and exec_prefill_alone_ms > 0
                then least(
                    greatest(exec_prefill_ms - exec_prefill_alone_ms, 0.0),
                    greatest(coalesce(exec_wait_est_ms, 0.0) - coalesce(exec_queue_ms, 0.0), 0.0)
                )
        end as exec_load_stretch_ms
    from prefill_modelled as m
    cross join thresholds as t
    left join exec_waits as w
        on m.request_key = w.request_key
        and m.attempt is not distinct from w.attempt
        and m.decision_span_id is not distinct from w.decision_span_id
),

final as (
    select
        * exclude (
            has_idle_fit, uncached_est_tokens, prefill_alone_ms, exec_prefill_alone_ms,
            exec_wait_est_ms, exec_seen_kv_usage, prefill_there_ms, exec_speed_factor,
            speed_differs
        ),
        prefill_there_ms as prefill_est_ms,
        -- idle, with the cache it had there (the replica's report where it ran, else its
        -- prefix history or the router's prediction): what the prompt alone costs there
        coalesce(
            prefill_alone_ms, prefill_intercept_ms + prefill_ms_per_token * uncached_est_tokens
        ) as prefill_ideal_ms,
        wait_est_ms + prefill_there_ms as ttft_est_ms,
        -- the wait in the router's units: what the same work would take at the fleet's speed
        -- (a router's queue estimate, and a policy re-run on the true load, know the load,
        -- not the replica's speed: a slow replica's longer wait is its speed, not the view)
        case when speed_differs then wait_est_ms / speed_factor else wait_est_ms end
            as wait_nominal_ms
    from prefill_estimated
)

select * from final
