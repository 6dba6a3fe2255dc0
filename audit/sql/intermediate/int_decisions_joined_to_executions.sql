-- int_decisions_joined_to_executions: one row per routing attempt (grain: decision_id) with
-- its attempt number inside the request and the replica execution it led to, if seen.
-- attempt = routeaudit.attempt when the router set it, else the order of decision time in the
-- request (0 first). The execution is the replica span whose parent is the attempt's forward
-- span (routeaudit.forward, vllm-router CLIENT, SMG http_request); failing that, for a request
-- with one attempt, the request's latest replica span (the trace was broken).
with

int_decisions_unioned_source as not materialized (

    select * from int_decisions_unioned

),

int_spans_clock_corrected_source as not materialized (

    select * from int_spans_clock_corrected

),

decisions_numbered as materialized (

    select
        *,
        coalesce(
            declared_attempt,
            row_number() over (
                partition by request_key
                order by decided_ns, decision_id
            ) - 1
        ) as attempt,
        count(*) over (partition by request_key) as attempts_in_request
    from int_decisions_unioned_source

),

replica_spans as materialized (

    select *
    from int_spans_clock_corrected_source
    where span_role = 'replica'

),

executions_by_parent as materialized (

    select
        decisions_numbered.decision_id,
        replica_spans.span_id as execution_span_id,
        replica_spans.self_replica as served_by,
        'parent' as execution_match,
        row_number() over (
            partition by decisions_numbered.decision_id
            order by
                (replica_spans.self_replica = decisions_numbered.chosen_replica)
                desc nulls last,
                replica_spans.start_ns desc,
                replica_spans.span_id asc
        ) as preference
    from decisions_numbered
    inner join replica_spans
        on replica_spans.trace_id = decisions_numbered.trace_id
        and replica_spans.parent_span_id = decisions_numbered.forward_span_id

),

executions_by_request as materialized (

    select
        decisions_numbered.decision_id,
        replica_spans.span_id as execution_span_id,
        replica_spans.self_replica as served_by,
        'request' as execution_match,
        row_number() over (
            partition by decisions_numbered.decision_id
            order by replica_spans.corrected_start_ns desc, replica_spans.span_id asc
        ) as preference
    from decisions_numbered
    inner join replica_spans
        on replica_spans.request_key = decisions_numbered.request_key
    where decisions_numbered.attempts_in_request = 1

),

final as (

    select
        decisions_numbered.decision_id,
        decisions_numbered.request_key,
        decisions_numbered.attempt,
        decisions_numbered.trace_id,
        decisions_numbered.span_id,
        decisions_numbered.router_span_id,
        decisions_numbered.forward_span_id,
        decisions_numbered.dialect,
        decisions_numbered.request_id,
        decisions_numbered.router_id,
        decisions_numbered.policy,
        decisions_numbered.decided_ns,
        decisions_numbered.corrected_decided_ns,
        decisions_numbered.clock_status,
        decisions_numbered.chosen_replica,
        decisions_numbered.reason,
        decisions_numbered.outcome,
        decisions_numbered.candidate_count,
        decisions_numbered.forward_status,
        decisions_numbered.forward_ms,
        decisions_numbered.recorded,
        coalesce(by_parent.execution_span_id, by_request.execution_span_id)
            as execution_span_id,
        coalesce(by_parent.served_by, by_request.served_by) as served_by,
        coalesce(by_parent.execution_match, by_request.execution_match)
            as execution_match
    from decisions_numbered
    left join executions_by_parent as by_parent
        on by_parent.decision_id = decisions_numbered.decision_id
        and by_parent.preference = 1
    left join executions_by_request as by_request
        on by_request.decision_id = decisions_numbered.decision_id
        and by_request.preference = 1

)

select * from final
