-- int_decisions_unioned: one row per routing attempt from every router dialect (grain:
-- decision_id), before attempts are numbered per request.
--   routeaudit : one per routeaudit.decision span (recorded = true); its forward child gives
--                forward_status / forward_ms; chosen = decision.chosen, else the candidate
--                event flagged chosen.
--   smg        : one per "Sending request" event on SMG's http_request span (the event url is
--                the chosen worker); a span without that event gives one row, chosen null.
--   vllm_router, prodstack : one per forward (CLIENT) span (url.full / vllm.backend_url); a
--                server span without a forward child gives one row from itself.
-- Third-party rows have recorded = false: reconstructed from the router's own spans.
with

int_spans_clock_corrected_source as not materialized (

    select * from int_spans_clock_corrected

),

stg_candidates_source as not materialized (

    select * from stg_candidates

),

stg_smg_sending_source as not materialized (

    select * from stg_smg_sending

),

routeaudit_decision_spans as materialized (

    select *
    from int_spans_clock_corrected_source
    where span_role = 'router_decision'

),

forward_spans as materialized (

    select *
    from int_spans_clock_corrected_source
    where span_role = 'router_forward'

),

last_forward_per_parent as materialized (

    select
        trace_id,
        parent_span_id,
        max_by(span_id, start_ns) as forward_span_id,
        max_by(http_status, start_ns) as forward_status,
        max_by(duration_ms, start_ns) as forward_ms,
        max_by(target_replica, start_ns) as forward_target
    from forward_spans
    group by trace_id, parent_span_id

),

candidate_counts as materialized (

    select
        trace_id,
        decision_span_id,
        count(*) as candidate_count,
        min(replica) filter (where declared_chosen) as chosen_candidate
    from stg_candidates_source
    group by trace_id, decision_span_id

),

routeaudit_decisions as materialized (

    select
        decisions.span_id as decision_id,
        decisions.request_key,
        decisions.trace_id,
        decisions.span_id,
        decisions.span_id as router_span_id,
        coalesce(last_forward.forward_span_id, decisions.span_id)
            as forward_span_id,
        decisions.dialect,
        decisions.request_id,
        decisions.attempt as declared_attempt,
        decisions.router_id,
        decisions.policy,
        decisions.decided_ns,
        decisions.corrected_decided_ns,
        decisions.clock_status,
        coalesce(
            decisions.chosen_replica,
            candidate_counts.chosen_candidate,
            last_forward.forward_target
        ) as chosen_replica,
        decisions.decision_reason as reason,
        decisions.decision_outcome as outcome,
        coalesce(
            decisions.declared_candidate_count, candidate_counts.candidate_count, 0
        ) as candidate_count,
        last_forward.forward_status,
        last_forward.forward_ms,
        true as recorded
    from routeaudit_decision_spans as decisions
    left join last_forward_per_parent as last_forward
        on last_forward.trace_id = decisions.trace_id
        and last_forward.parent_span_id = decisions.span_id
    left join candidate_counts
        on candidate_counts.trace_id = decisions.trace_id
        and candidate_counts.decision_span_id = decisions.span_id

),

smg_server_spans as materialized (

    select *
    from int_spans_clock_corrected_source
    where dialect = 'smg'
        and span_role = 'router_server'

),

smg_decisions as materialized (

    select
        smg.span_id || ':' || coalesce(cast(sending.event_index as varchar), '-')
            as decision_id,
        smg.request_key,
        smg.trace_id,
        smg.span_id,
        smg.span_id as router_span_id,
        smg.span_id as forward_span_id,
        smg.dialect,
        smg.request_id,
        cast(null as bigint) as declared_attempt,
        smg.router_id,
        smg.policy,
        coalesce(sending.sent_ns, smg.start_ns) as decided_ns,
        coalesce(sending.sent_ns, smg.start_ns) - smg.clock_offset_ns
            as corrected_decided_ns,
        smg.clock_status,
        sending.replica as chosen_replica,
        cast(null as varchar) as reason,
        case
            when sending.replica is not null then 'routed'
            when smg.http_status in (429, 503) then 'rejected'
            else 'error'
        end as outcome,
        cast(0 as bigint) as candidate_count,
        smg.http_status as forward_status,
        cast(null as double) as forward_ms,
        false as recorded
    from smg_server_spans as smg
    left join stg_smg_sending_source as sending
        on sending.trace_id = smg.trace_id
        and sending.router_span_id = smg.span_id

),

third_party_forward_spans as materialized (

    select *
    from forward_spans
    where dialect in ('vllm_router', 'prodstack')

),

third_party_server_spans as materialized (

    select *
    from int_spans_clock_corrected_source
    where dialect in ('vllm_router', 'prodstack')
        and span_role = 'router_server'

),

third_party_forward_decisions as materialized (

    select
        forwards.span_id as decision_id,
        forwards.request_key,
        forwards.trace_id,
        forwards.span_id,
        coalesce(servers.span_id, forwards.span_id) as router_span_id,
        forwards.span_id as forward_span_id,
        forwards.dialect,
        coalesce(servers.request_id, forwards.request_id) as request_id,
        cast(null as bigint) as declared_attempt,
        forwards.router_id,
        coalesce(forwards.policy, servers.policy) as policy,
        forwards.start_ns as decided_ns,
        forwards.corrected_start_ns as corrected_decided_ns,
        forwards.clock_status,
        forwards.target_replica as chosen_replica,
        cast(null as varchar) as reason,
        case
            when forwards.target_replica is not null then 'routed'
            else 'error'
        end as outcome,
        cast(0 as bigint) as candidate_count,
        forwards.http_status as forward_status,
        forwards.duration_ms as forward_ms,
        false as recorded
    from third_party_forward_spans as forwards
    left join third_party_server_spans as servers
        on servers.trace_id = forwards.trace_id
        and servers.span_id = forwards.parent_span_id

),

third_party_server_decisions as materialized (

    select
        servers.span_id as decision_id,
        servers.request_key,
        servers.trace_id,
        servers.span_id,
        servers.span_id as router_span_id,
        servers.span_id as forward_span_id,
        servers.dialect,
        servers.request_id,
        cast(null as bigint) as declared_attempt,
        servers.router_id,
        servers.policy,
        servers.start_ns as decided_ns,
        servers.corrected_start_ns as corrected_decided_ns,
        servers.clock_status,
        servers.target_replica as chosen_replica,
        cast(null as varchar) as reason,
        case
            when servers.target_replica is not null then 'routed'
            when servers.http_status in (429, 503) then 'rejected'
            else 'error'
        end as outcome,
        cast(0 as bigint) as candidate_count,
        servers.http_status as forward_status,
        cast(null as double) as forward_ms,
        false as recorded
    from third_party_server_spans as servers
    left join last_forward_per_parent as last_forward
        on last_forward.trace_id = servers.trace_id
        and last_forward.parent_span_id = servers.span_id
    where last_forward.forward_span_id is null

),

final as (

    select * from routeaudit_decisions
    union all
    select * from smg_decisions
    union all
    select * from third_party_forward_decisions
    union all
    select * from third_party_server_decisions

)

select * from final
