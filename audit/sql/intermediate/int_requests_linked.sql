-- int_requests_linked: one row per side span (grain: trace_id, span_id) with the logical
-- request it belongs to (request_key) and how its group was linked.
--
-- 1. int_spans_anchored_by_trace groups spans by parent chain (a "group" = one anchor).
-- 2. A group without a client (anchored on a router or replica span) is merged into a group of
--    better rank (client < router < replica) that is in the same trace (parent chain broken by
--    a missing span) or shares a request id (the router started a new trace, e.g. SMG; link by
--    x-request-id / x-correlation-id / vLLM's unwrapped gen_ai.request.id). Preference: shares
--    a request id, then same trace, then better rank, then nearest start time, then ids.
-- 3. Request ids repeat (runs replayed, clients reusing ids), so the request-id fallback links
--    only groups that can be one request: same run or no run, overlapping in time on the
--    corrected clocks (int_clock_offsets of each span's domain and partition; 1 s tolerance
--    for offsets that are estimates or unknown), and compatible sides: a group with router
--    spans joins no group whose router spans are another router's, and of several router
--    groups of different routers that would join one group by request id alone, only the
--    nearest router's do. A client group is never merged (rank 1 is the best), so no request
--    gets two client spans. Otherwise the groups stay separate requests.
-- 4. Merges are followed twice (replica -> router -> client).
with

stg_spans_source as not materialized (

    select * from stg_spans

),

int_spans_anchored_by_trace_source as not materialized (

    select * from int_spans_anchored_by_trace

),

int_clock_offsets_source as not materialized (

    select * from int_clock_offsets

),

stg_partitioning_source as not materialized (

    select * from stg_partitioning

),

anchored_side_spans as materialized (

    select
        anchored.trace_id,
        anchored.span_id,
        anchored.span_role,
        anchored.anchor_span_id,
        anchored.anchor_role,
        spans.request_id,
        spans.run_id,
        spans.start_ns,
        spans.start_ns - coalesce(offsets.offset_ns, 0) as corrected_start_ns,
        coalesce(spans.end_ns, spans.start_ns) - coalesce(offsets.offset_ns, 0)
            as corrected_end_ns,
        case
            when anchored.span_role like 'router_%' then coalesce(spans.router_id, '')
        end as router_name
    from int_spans_anchored_by_trace_source as anchored
    inner join stg_spans_source as spans
        on spans.trace_id = anchored.trace_id
        and spans.span_id = anchored.span_id
    cross join stg_partitioning_source as partitioning
    left join int_clock_offsets_source as offsets
        on offsets.part = spans.start_ns // partitioning.partition_ns
        and offsets.clock_domain = spans.clock_domain

),

groups_by_anchor as materialized (

    select
        trace_id,
        anchor_span_id,
        min(anchor_role) as anchor_role,
        case min(anchor_role)
            when 'client' then 1
            when 'router' then 2
            else 3
        end as group_rank,
        min(start_ns) as group_start_ns,
        min(corrected_start_ns) as corrected_start_ns,
        max(corrected_end_ns) as corrected_end_ns,
        min(router_name) as router_name,
        max(router_name) as max_router_name,
        min(run_id) as run_id
    from anchored_side_spans
    group by trace_id, anchor_span_id

),

group_request_ids as materialized (

    select distinct
        trace_id,
        anchor_span_id,
        request_id
    from anchored_side_spans
    where request_id is not null

),

merge_candidates_by_trace as materialized (

    select
        from_group.trace_id,
        from_group.anchor_span_id,
        to_group.trace_id as to_trace_id,
        to_group.anchor_span_id as to_anchor_span_id,
        to_group.group_rank as to_group_rank,
        abs(to_group.group_start_ns - from_group.group_start_ns) as distance_ns,
        true as same_trace
    from groups_by_anchor as from_group
    inner join groups_by_anchor as to_group
        on to_group.trace_id = from_group.trace_id
        and to_group.group_rank < from_group.group_rank

),

merge_candidates_by_request_id as materialized (

    select
        from_ids.trace_id,
        from_ids.anchor_span_id,
        to_ids.trace_id as to_trace_id,
        to_ids.anchor_span_id as to_anchor_span_id,
        to_group.group_rank as to_group_rank,
        abs(to_group.group_start_ns - from_group.group_start_ns) as distance_ns,
        to_ids.trace_id = from_ids.trace_id as same_trace
    from group_request_ids as from_ids
    inner join group_request_ids as to_ids
        on to_ids.request_id = from_ids.request_id
    inner join groups_by_anchor as from_group
        on from_group.trace_id = from_ids.trace_id
        and from_group.anchor_span_id = from_ids.anchor_span_id
    inner join groups_by_anchor as to_group
        on to_group.trace_id = to_ids.trace_id
        and to_group.anchor_span_id = to_ids.anchor_span_id
    where to_group.group_rank < from_group.group_rank
        and (
            from_group.run_id is null
            or to_group.run_id is null
            or from_group.run_id = to_group.run_id
        )
        -- at the same time: each starts before the other ends (1 s tolerance)
        and from_group.corrected_start_ns <= to_group.corrected_end_ns + 1000000000
        and to_group.corrected_start_ns <= from_group.corrected_end_ns + 1000000000
        -- one router: a router group does not join another router's request
        and (
            from_group.router_name is null
            or to_group.router_name is null
            or (
                from_group.router_name = to_group.router_name
                and from_group.max_router_name = to_group.max_router_name
            )
        )

),

merge_candidates_unioned as materialized (

    select
        *,
        false as shares_request_id
    from merge_candidates_by_trace

    union all

    select
        *,
        true as shares_request_id
    from merge_candidates_by_request_id

),

merge_candidates as materialized (

    select
        trace_id,
        anchor_span_id,
        to_trace_id,
        to_anchor_span_id,
        to_group_rank,
        distance_ns,
        bool_or(same_trace) as same_trace,
        bool_or(shares_request_id) as shares_request_id
    from merge_candidates_unioned
    group by
        trace_id,
        anchor_span_id,
        to_trace_id,
        to_anchor_span_id,
        to_group_rank,
        distance_ns

),

merge_candidates_ranked as materialized (

    select
        *,
        row_number() over (
            partition by trace_id, anchor_span_id
            order by
                shares_request_id desc,
                same_trace desc,
                to_group_rank asc,
                distance_ns asc,
                to_trace_id asc,
                to_anchor_span_id asc
        ) as preference
    from merge_candidates

),

first_choices as materialized (

    select
        ranked.trace_id,
        ranked.anchor_span_id,
        ranked.to_trace_id,
        ranked.to_anchor_span_id,
        ranked.distance_ns,
        ranked.same_trace,
        from_group.router_name as from_router_name
    from merge_candidates_ranked as ranked
    inner join groups_by_anchor as from_group
        on from_group.trace_id = ranked.trace_id
        and from_group.anchor_span_id = ranked.anchor_span_id
    where ranked.preference = 1

),

first_merges as materialized (

    -- router groups joining one group: the router of the nearest (same trace first) is the
    -- request's; another router's group joined by request id alone stays a request of its own
    select
        trace_id,
        anchor_span_id,
        to_trace_id,
        to_anchor_span_id,
        case when same_trace then 'trace' else 'request_id' end as merge_method
    from first_choices
    qualify
        same_trace
        or from_router_name is null
        or from_router_name = first_value(from_router_name) over (
            partition by to_trace_id, to_anchor_span_id, from_router_name is null
            order by same_trace desc, distance_ns asc, trace_id asc, anchor_span_id asc
        )

),

resolved_groups as materialized (

    select
        groups_by_anchor.trace_id,
        groups_by_anchor.anchor_span_id,
        coalesce(
            second_merge.to_trace_id,
            first_merge.to_trace_id,
            groups_by_anchor.trace_id
        ) as request_trace_id,
        coalesce(
            second_merge.to_anchor_span_id,
            first_merge.to_anchor_span_id,
            groups_by_anchor.anchor_span_id
        ) as request_anchor_span_id,
        case
            when first_merge.merge_method = 'request_id'
                or second_merge.merge_method = 'request_id'
                then 'request_id'
            when first_merge.merge_method is not null then 'trace'
        end as merge_method
    from groups_by_anchor
    left join first_merges as first_merge
        on first_merge.trace_id = groups_by_anchor.trace_id
        and first_merge.anchor_span_id = groups_by_anchor.anchor_span_id
    left join first_merges as second_merge
        on second_merge.trace_id = first_merge.to_trace_id
        and second_merge.anchor_span_id = first_merge.to_anchor_span_id

),

spans_with_request as materialized (

    select
        anchored_side_spans.trace_id,
        anchored_side_spans.span_id,
        anchored_side_spans.span_role,
        resolved_groups.request_trace_id,
        resolved_groups.request_anchor_span_id,
        resolved_groups.request_trace_id || '-'
        || resolved_groups.request_anchor_span_id as request_key,
        resolved_groups.merge_method
    from anchored_side_spans
    inner join resolved_groups
        on resolved_groups.trace_id = anchored_side_spans.trace_id
        and resolved_groups.anchor_span_id = anchored_side_spans.anchor_span_id

),

link_method_per_request as materialized (

    select
        request_key,
        case
            when bool_or(merge_method = 'request_id') then 'request_id'
            when count(distinct
                case when span_role like 'router_%' then 'router'
                    else span_role end) > 1 then 'trace'
            else 'none'
        end as link_method
    from spans_with_request
    group by request_key

),

final as (

    select
        spans_with_request.trace_id,
        spans_with_request.span_id,
        spans_with_request.span_role,
        spans_with_request.request_key,
        spans_with_request.request_trace_id,
        spans_with_request.request_anchor_span_id,
        link_method_per_request.link_method
    from spans_with_request
    inner join link_method_per_request
        on link_method_per_request.request_key = spans_with_request.request_key

)

select * from final
