-- int_attr_thresholds: one row. Every threshold the cause rules use, each overridable with a
-- session variable of the same name prefixed `routeaudit_` (docs/attribution.md explains each).
with

thresholds as (
    select
        -- misrouting: an alternative must save at least this much replica-side TTFT ...
        cast(coalesce(getvariable('routeaudit_misroute_min_ms'), 100.0) as double)
            as misroute_min_ms,
        -- ... and either make the request meet the TTFT SLO or save this share of it
        cast(coalesce(getvariable('routeaudit_misroute_min_frac'), 0.2) as double)
            as misroute_min_frac,
        -- stale telemetry: age of the chosen replica's telemetry at decision time
        cast(coalesce(getvariable('routeaudit_stale_age_ms'), 1000.0) as double)
            as stale_age_ms,
        -- stale telemetry: |true waiting - (seen waiting + pending)| at least this
        cast(coalesce(getvariable('routeaudit_stale_min_gap'), 2) as bigint)
            as stale_min_gap,
        -- herding: decisions onto one replica on one telemetry sample
        cast(coalesce(getvariable('routeaudit_herding_min_decisions'), 3) as bigint)
            as herding_min_decisions,
        -- eviction / cache calibration: tokens of tolerance (about one KV block)
        cast(coalesce(getvariable('routeaudit_cache_tolerance_tokens'), 16) as bigint)
            as cache_tolerance_tokens,
        -- KV pressure: usage fraction that counts as pressure
        cast(coalesce(getvariable('routeaudit_kv_pressure'), 0.85) as double)
            as kv_pressure,
        -- how far back KV pressure / prior service is looked for, ms
        cast(coalesce(getvariable('routeaudit_lookback_ms'), 30000.0) as double)
            as lookback_ms,
        -- slow replica: its prefills take at least this multiple of the fleet's time, a
        -- speed of at most 0.85, where its slowness alone costs every request on it the
        -- share of its TTFT a cause must reach (1 - cause_min_frac): 1 / 0.85
        cast(coalesce(getvariable('routeaudit_slow_replica_ratio'), 1.1764705882352942) as double)
            as slow_replica_ratio,
        -- slow decode (TPOT): decode ms/token at least this multiple of the fleet median
        cast(coalesce(getvariable('routeaudit_slow_decode_ratio'), 1.5) as double)
            as slow_decode_ratio,
        -- client network: client TTFT - replica TTFT at least this ...
        cast(coalesce(getvariable('routeaudit_client_gap_min_ms'), 200.0) as double)
            as client_gap_min_ms,
        -- ... and at least this multiple of the replica TTFT
        cast(coalesce(getvariable('routeaudit_client_gap_ratio'), 0.5) as double)
            as client_gap_ratio,
        -- a cause is reported only when its excess is at least this ...
        cast(coalesce(getvariable('routeaudit_cause_min_ms'), 100.0) as double)
            as cause_min_ms,
        -- ... and at least this share of the request's TTFT
        cast(coalesce(getvariable('routeaudit_cause_min_frac'), 0.15) as double)
            as cause_min_frac,
        -- estimates (ms) closer than this are equal: ranked on a grid of it, compared with it
        -- as a margin, the tie then broken by a stable key (docs/attribution.md)
        cast(coalesce(getvariable('routeaudit_estimate_tolerance_ms'), 0.1) as double)
            as estimate_tolerance_ms,
        -- overload: the request's own measured queue must be at least this long
        cast(coalesce(getvariable('routeaudit_overload_min_queue_ms'), 100.0) as double)
            as overload_min_queue_ms,
        -- the cache_aware policy replayed on the true state (SGLang router's defaults):
        -- imbalanced when max - min load exceeds this ...
        cast(coalesce(getvariable('routeaudit_cache_aware_balance_abs'), 64) as double)
            as cache_aware_balance_abs,
        -- ... and max load exceeds min load times this; then it takes the least loaded
        cast(coalesce(getvariable('routeaudit_cache_aware_balance_rel'), 1.5) as double)
            as cache_aware_balance_rel,
        -- ... else the best prefix match when its share of the prompt exceeds this
        cast(coalesce(getvariable('routeaudit_cache_aware_cache_threshold'), 0.3) as double)
            as cache_aware_cache_threshold,
        -- calibration: observations a replica needs before its own fit is used
        cast(coalesce(getvariable('routeaudit_calibration_min_n'), 5) as bigint)
            as calibration_min_n
),

final as (
    select * from thresholds
)

select * from final
