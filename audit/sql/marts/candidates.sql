-- candidates: one row per candidate replica per routeaudit decision (grain: decision_id,
-- replica; event_index breaks ties if a router listed a replica twice). telemetry_age_ms is the
-- router's own figure, else decision time minus telemetry time (both router clock).
with

stg_candidates_source as not materialized (

    select * from stg_candidates

),

decisions_source as not materialized (

    select * from decisions

),

int_spans_clock_corrected_source as not materialized (

    select * from int_spans_clock_corrected

),

final as (

    select
        decisions_source.request_key,
        decisions_source.request_id,
        decisions_source.attempt,
        decisions_source.decision_id,
        candidates.decision_span_id,
        candidates.event_index,
        candidates.replica,
        candidates.eligible,
        candidates.excluded_reason,
        coalesce(
            candidates.declared_chosen,
            candidates.replica = decisions_source.chosen_replica,
            false
        ) as chosen,
        candidates.waiting,
        candidates.running,
        candidates.kv_usage,
        candidates.remaining_tokens,
        to_timestamp(
            (candidates.telemetry_ts_ns - decision_spans.clock_offset_ns) / 1e9
        ) as telemetry_ts,
        coalesce(
            candidates.declared_telemetry_age_ms,
            (decisions_source.decided_ns - candidates.telemetry_ts_ns) / 1e6
        ) as telemetry_age_ms,
        candidates.pending,
        candidates.predicted_cached_tokens,
        candidates.est_queue_ms,
        candidates.est_prefill_ms,
        candidates.score,
        -- the decision's router and time, so telemetry-age queries need no join to decisions
        decisions_source.router_id,
        decisions_source.decided_at
    from stg_candidates_source as candidates
    inner join decisions_source
        on decisions_source.trace_id = candidates.trace_id
        and decisions_source.span_id = candidates.decision_span_id
        and decisions_source.dialect = 'routeaudit'
    inner join int_spans_clock_corrected_source as decision_spans
        on decision_spans.trace_id = candidates.trace_id
        and decision_spans.span_id = candidates.decision_span_id

)

select * from final
