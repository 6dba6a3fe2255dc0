-- requests: one row per logical request (grain: request_key = trace id and span id of the
-- request's anchor span: the client span, else the topmost router span, else the replica
-- span). Sides are joined in int_requests_linked (trace first, request id when a router broke
-- the trace). Timings come from one side only: the client when it reported a TTFT, else the
-- replica; tpot_ms = (e2e_ms - ttft_ms) / (output_tokens - 1), null when fewer than 2 tokens.
-- Status comes from whichever side saw the outcome (requests_failed: a failed or timed-out
-- forward, a 5xx, the router's own error answer), with that side and its reason.
with

int_spans_clock_corrected_source as not materialized (

    select * from int_spans_clock_corrected

),

int_decisions_joined_to_executions_source as not materialized (

    select * from int_decisions_joined_to_executions

),

stg_candidates_source as not materialized (

    select * from stg_candidates

),

stg_partitioning_source as not materialized (

    select * from stg_partitioning

),

watermark as materialized (

    -- the newest event time stored minus the allowed lateness: a partition whose requests can
    -- receive no more spans before the watermark passes (end + max_request_s) is final
    select
        p.partition_ns,
        max(s.corrected_start_ns) - cast(p.lateness_s * 1e9 as bigint) as watermark_ns,
        cast(p.max_request_s * 1e9 as bigint) as max_request_ns
    from int_spans_clock_corrected_source as s
    cross join stg_partitioning_source as p
    group by p.partition_ns, p.lateness_s, p.max_request_s

),

side_spans as materialized (

    -- only the fields read below (each side becomes a struct column of requests_joined), and
    -- those that pick a side
    select
        request_key,
        request_id,
        trace_id,
        span_id,
        run_id,
        model,
        endpoint,
        usage_input_tokens,
        request_input_tokens,
        usage_output_tokens,
        usage_cached_tokens,
        max_tokens,
        stream,
        corrected_start_ns,
        duration_ms,
        client_ttft_ms,
        router_ttfb_ms,
        client_e2e_ms,
        engine_ttft_ms,
        engine_e2e_ms,
        engine_queue_ms,
        engine_prefill_ms,
        engine_decode_ms,
        finish_reason,
        http_status,
        declared_status,
        otel_status,
        status_message,
        client_error,
        router_id,
        self_replica,
        span_role,
        start_ns
    from int_spans_clock_corrected_source

),

client_sides as materialized (

    select *
    from side_spans
    where span_role = 'client'
    qualify row_number() over (
        partition by request_key order by start_ns, span_id
    ) = 1

),

router_sides as materialized (

    select *
    from side_spans
    where span_role like 'router_%'
    qualify row_number() over (
        partition by request_key
        order by
            case span_role
                when 'router_server' then 0
                when 'router_decision' then 1
                else 2
            end,
            start_ns,
            span_id
    ) = 1

),

replica_sides as materialized (

    select *
    from side_spans
    where span_role = 'replica'
    qualify row_number() over (
        partition by request_key
        order by corrected_start_ns desc, span_id desc
    ) = 1

),

sides_per_request as materialized (

    select
        request_key,
        min(request_trace_id) as request_trace_id,
        min(link_method) as link_method,
        bool_or(span_role = 'client') as has_client,
        bool_or(span_role like 'router_%') as has_router,
        bool_or(span_role = 'replica') as has_replica,
        bool_or(clock_status = 'inconsistent')
            or (
                bool_or(clock_status = 'unbounded')
                and count(distinct clock_domain) > 1
            ) as clock_suspect,
        min(corrected_start_ns) as first_seen_ns,
        min(run_id) as any_run_id,
        min(model) as any_model,
        min(max_tokens) as any_max_tokens,
        bool_or(stream) as any_stream,
        min(endpoint) filter (where span_role <> 'replica') as any_endpoint,
        min(request_input_tokens) as any_request_input_tokens
    from int_spans_clock_corrected_source
    group by request_key

),

final_decisions as materialized (

    select
        request_key,
        count(*) as attempts,
        max_by(decision_id, final_order) as decision_id,
        max_by(router_id, final_order) as router_id,
        max_by(policy, final_order) as policy,
        max_by(chosen_replica, final_order) as chosen_replica,
        max_by(outcome, final_order) as outcome,
        max_by(forward_status, final_order) as forward_status,
        max_by(trace_id, final_order) as trace_id,
        max_by(span_id, final_order) as span_id,
        max_by(forward_span_id, final_order) as forward_span_id,
        max_by(reason, final_order) as reason,
        max_by(request_id, final_order) as request_id
    from (
        -- the last attempt is final; a router that numbers every retry 0 still has one final
        -- attempt: the latest decided, then the highest decision span id
        select
            *,
            (attempt, coalesce(decided_ns, -1), span_id) as final_order
        from int_decisions_joined_to_executions_source
    ) as attempts_ordered
    group by request_key

),

final_attempts as materialized (

    -- the final attempt with what its own spans say went wrong: only the last attempt decides
    -- the request's fate (an earlier refused forward that was retried is not a failure)
    select
        final_decisions.*,
        forward_span.http_status as forward_http_status,
        forward_span.otel_status = 'error' as forward_failed,
        forward_span.status_message as forward_message,
        decision_span.otel_status = 'error' as decision_failed,
        decision_span.status_message as decision_message
    from final_decisions
    left join side_spans as forward_span
        on forward_span.trace_id = final_decisions.trace_id
        and forward_span.span_id = final_decisions.forward_span_id
        and forward_span.span_role = 'router_forward'
    left join side_spans as decision_span
        on decision_span.trace_id = final_decisions.trace_id
        and decision_span.span_id = final_decisions.span_id
        and decision_span.span_role = 'router_decision'

),

predicted_cache_of_chosen as materialized (

    select
        final_decisions.request_key,
        max(candidates.predicted_cached_tokens) as predicted_cached_tokens
    from final_decisions
    inner join stg_candidates_source as candidates
        on candidates.trace_id = final_decisions.trace_id
        and candidates.decision_span_id = final_decisions.span_id
    where coalesce(
        candidates.declared_chosen,
        candidates.replica = final_decisions.chosen_replica
    )
    group by final_decisions.request_key

),

requests_joined as (

    -- not materialized, nor requests_timed: each is read once, and copying their rows (four
    -- struct sides of ~30 fields each) cost a fifth of this relation built alone at 1M
    -- (10.8 -> 8.3 s; docs/performance.md)
    select
        sides.request_key,
        coalesce(
            client.request_id,
            decision.request_id,
            router.request_id,
            replica.request_id
        ) as request_id,
        coalesce(client.trace_id, sides.request_trace_id) as trace_id,
        coalesce(client.run_id, router.run_id, replica.run_id, sides.any_run_id)
            as run_id,
        coalesce(client.model, router.model, replica.model, sides.any_model)
            as model,
        coalesce(client.endpoint, router.endpoint, sides.any_endpoint)
            as endpoint,
        coalesce(
            replica.usage_input_tokens,
            client.usage_input_tokens,
            client.request_input_tokens,
            sides.any_request_input_tokens
        ) as input_tokens,
        coalesce(
            client.max_tokens,
            router.max_tokens,
            replica.max_tokens,
            sides.any_max_tokens
        ) as max_tokens,
        coalesce(client.stream, router.stream, sides.any_stream) as stream,
        to_timestamp(client.corrected_start_ns / 1e9) as client_start,
        to_timestamp(sides.first_seen_ns / 1e9) as first_seen_at,
        sides.first_seen_ns,
        case
            when client.client_ttft_ms is not null then 'client'
            when replica.engine_ttft_ms is not null then 'replica'
            when client.span_id is not null then 'client'
            when replica.span_id is not null then 'replica'
            when router.span_id is not null then 'router'
        end as timing_source,
        client,
        router,
        replica,
        decision,
        predicted.predicted_cached_tokens,
        sides.has_client,
        sides.has_router,
        sides.has_replica,
        sides.link_method,
        sides.clock_suspect
    from sides_per_request as sides
    left join client_sides as client
        on client.request_key = sides.request_key
    left join router_sides as router
        on router.request_key = sides.request_key
    left join replica_sides as replica
        on replica.request_key = sides.request_key
    left join final_attempts as decision
        on decision.request_key = sides.request_key
    left join predicted_cache_of_chosen as predicted
        on predicted.request_key = sides.request_key

),

requests_timed as (

    select
        *,
        case timing_source
            when 'client' then client.client_ttft_ms
            when 'replica' then replica.engine_ttft_ms
        end as ttft_ms,
        case timing_source
            when 'client'
                then coalesce(client.client_e2e_ms, client.duration_ms)
            when 'replica'
                then coalesce(replica.engine_e2e_ms, replica.duration_ms)
            when 'router' then router.duration_ms
        end as e2e_ms,
        coalesce(replica.usage_output_tokens, client.usage_output_tokens)
            as output_tokens,
        coalesce(client.finish_reason, replica.finish_reason) as finish_reason,
        coalesce(client.http_status, router.http_status, decision.forward_status)
            as http_status
    from requests_joined

),

requests_failed as (

    -- the first side with something to say decides: the client's declared outcome, then HTTP
    -- statuses (the client's, the router's own answer, what the final forward read), a finish
    -- reason abort, the replica's declared outcome, then spans that ended in error (client,
    -- router, the final forward, the final decision), the replica's HTTP status, the replica's
    -- span. Each branch gives a declared status, or an HTTP status, or only a reason (an
    -- error span's message), turned into the request's status in the next step
    select
        *,
        case
            when client.declared_status in (
                'ok', 'error', 'timeout', 'cancelled', 'rejected'
            ) then {
                'status': client.declared_status,
                'http_status': null,
                'source': 'client',
                'reason': coalesce(client.client_error, client.status_message)
            }
            when decision.outcome = 'rejected' then {
                'status': 'rejected',
                'http_status': null,
                'source': 'router',
                'reason': coalesce(decision.reason, 'rejected by the router')
            }
            when client.http_status >= 400 then {
                'status': null,
                'http_status': client.http_status,
                'source': 'client',
                'reason': 'HTTP ' || cast(client.http_status as varchar)
            }
            when client.http_status is null and router.http_status >= 400 then {
                'status': null,
                'http_status': router.http_status,
                'source': 'router',
                'reason': 'router answered HTTP ' || cast(router.http_status as varchar)
            }
            when client.http_status is null
                and router.http_status is null
                and decision.forward_status >= 400 then {
                'status': null,
                'http_status': decision.forward_status,
                'source': 'router',
                'reason': 'forward got HTTP ' || cast(decision.forward_status as varchar)
            }
            when finish_reason = 'abort' then {
                'status': 'cancelled',
                'http_status': null,
                'source': case when client.finish_reason = 'abort' then 'client' else 'replica' end,
                'reason': 'finish reason abort'
            }
            when replica.declared_status in (
                'ok', 'error', 'timeout', 'cancelled', 'rejected'
            ) then {
                'status': replica.declared_status,
                'http_status': null,
                'source': 'replica',
                'reason': replica.status_message
            }
            when client.otel_status = 'error' then {
                'status': null,
                'http_status': null,
                'source': 'client',
                'reason': coalesce(client.status_message, 'client span ended in error')
            }
            when router.otel_status = 'error' then {
                'status': null,
                'http_status': null,
                'source': 'router',
                'reason': coalesce(router.status_message, 'router span ended in error')
            }
            when decision.forward_failed then {
                'status': null,
                'http_status': null,
                'source': 'router',
                'reason': coalesce(decision.forward_message, 'forward ended in error')
            }
            when decision.decision_failed then {
                'status': null,
                'http_status': null,
                'source': 'router',
                'reason': coalesce(decision.decision_message, 'decision ended in error')
            }
            when replica.http_status >= 400 then {
                'status': null,
                'http_status': replica.http_status,
                'source': 'replica',
                'reason': 'replica answered HTTP ' || cast(replica.http_status as varchar)
            }
            when replica.otel_status = 'error' then {
                'status': null,
                'http_status': null,
                'source': 'replica',
                'reason': coalesce(replica.status_message, 'replica span ended in error')
            }
        end as failure
    from requests_timed

),

requests_judged as (

    select
        *,
        case
            when failure.status is not null then failure.status
            when failure.http_status in (408, 504) then 'timeout'
            when failure.http_status = 499 then 'cancelled'
            when failure.http_status = 429 then 'rejected'
            when failure.http_status >= 400 then 'error'
            -- an error span's own words: httpx ReadTimeout, asyncio TimeoutError, "timed out"
            when regexp_matches(failure.reason, '(?i)timeout|timed out') then 'timeout'
            when failure.source is not null then 'error'
            else 'ok'
        end as status,
        first_seen_ns // (select partition_ns from watermark) as part,
        (first_seen_ns // (select partition_ns from watermark) + 1)
        * (select partition_ns from watermark)
        + (select max_request_ns from watermark)
        <= (select watermark_ns from watermark) as verdict_final
    from requests_failed

),

final as (

    select
        request_key,
        request_id,
        trace_id,
        run_id,
        model,
        endpoint,
        input_tokens,
        max_tokens,
        stream,
        client_start,
        first_seen_at,
        ttft_ms,
        case
            when output_tokens >= 2 and e2e_ms is not null and ttft_ms is not null
                then (e2e_ms - ttft_ms) / (output_tokens - 1)
        end as tpot_ms,
        e2e_ms,
        timing_source,
        output_tokens,
        finish_reason,
        status,
        http_status,
        case when status <> 'ok' then failure.source end as failure_source,
        case when status <> 'ok' then failure.reason end as failure_reason,
        coalesce(decision.router_id, router.router_id) as router_id,
        decision.policy,
        coalesce(decision.attempts, 0) as attempts,
        decision.chosen_replica,
        replica.self_replica as served_by,
        predicted_cached_tokens,
        coalesce(replica.usage_cached_tokens, client.usage_cached_tokens)
            as actual_cached_tokens,
        router.duration_ms as router_ms,
        router.router_ttfb_ms,
        replica.engine_queue_ms as queue_ms,
        replica.engine_prefill_ms as prefill_ms,
        replica.engine_decode_ms as decode_ms,
        replica.engine_ttft_ms as replica_ttft_ms,
        has_client,
        has_router,
        has_replica,
        has_client and has_replica and not has_router as router_side_missing,
        link_method,
        clock_suspect,
        first_seen_ns as anchor_ns,
        part,
        verdict_final
    from requests_judged

)

-- stored in event-time order, so a time window reads only the row groups it covers (a slice
-- appends its rows after the older ones, in the same order)
select * from final
order by anchor_ns, request_key
