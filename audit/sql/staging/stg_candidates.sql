-- stg_candidates: one row per routeaudit.candidate span event (grain: trace_id, span_id,
-- event_index), i.e. one per candidate replica a routeaudit decision span considered.
-- Renamed and cast; the replica id is normalised like stg_spans (host:port, localhost ->
-- 127.0.0.1, '#<rank>' suffix only for DP rank > 0). No joins, no aggregation.
with

raw_span_events_source as (

    select * from raw_span_events

),

candidate_events as (

    select
        trace_id,
        span_id as decision_span_id,
        event_index,
        time_ns as event_ns,
        c_replica as raw_replica,
        c_dp_rank as dp_rank,
        c_eligible as eligible,
        c_excluded_reason as excluded_reason,
        c_chosen as declared_chosen,
        c_waiting as waiting,
        c_running as running,
        c_kv_usage as kv_usage,
        c_remaining_tokens as remaining_tokens,
        c_telemetry_ts_ns as telemetry_ts_ns,
        c_telemetry_age_ms as declared_telemetry_age_ms,
        c_pending as pending,
        c_predicted_cached_tokens as predicted_cached_tokens,
        c_est_queue_ms as est_queue_ms,
        c_est_prefill_ms as est_prefill_ms,
        c_score as score
    from raw_span_events_source
    where name = 'routeaudit.candidate'

),

final as (

    select
        trace_id,
        decision_span_id,
        event_index,
        event_ns,
        raw_replica,
        case
            when nullif(trim(raw_replica), '') is null then null
            when regexp_matches(trim(raw_replica), '^[A-Za-z][A-Za-z0-9+.-]*://')
                or regexp_matches(
                    trim(raw_replica), '^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$'
                )
                then regexp_replace(
                    regexp_extract(
                        lower(trim(raw_replica)),
                        '^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?'
                        || '((?:\[[^\]]+\]|[^/:?#]+)(?::[0-9]+)?)',
                        1
                    ),
                    '^(localhost|0\.0\.0\.0|\[::1\]|\[::\])(:|$)',
                    '127.0.0.1\2'
                )
            else trim(raw_replica)
        end
        || case when dp_rank > 0 then '#' || cast(dp_rank as varchar) else '' end
            as replica,
        dp_rank,
        eligible,
        excluded_reason,
        declared_chosen,
        waiting,
        running,
        kv_usage,
        remaining_tokens,
        telemetry_ts_ns,
        declared_telemetry_age_ms,
        pending,
        predicted_cached_tokens,
        est_queue_ms,
        est_prefill_ms,
        score
    from candidate_events

)

select * from final
